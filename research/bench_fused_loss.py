"""Peak memory of one training step (forward and backward) of an OLMo-core
model with the natural bias and the gain, OLMo-core's ``fused_linear`` loss
against its default loss, at a realistic vocabulary: OLMo 2's 100,278-id
tokenizer padded to 100,352, the olmo2_30M preset's trunk (d 256, 4 layers),
a batch of 4 x 512 tokens; stock models (no natural bias) beside them.

Each arm runs in a fresh process on the CPU. The process's peak resident
memory (VmHWM) is reset (/proc/self/clear_refs) after the model is built,
one warm-up step of 64 tokens has run and malloc has handed back what was
freed (malloc_trim), so what it reads after the measured step is that step's peak; growth = that peak - the resident memory before
the step. The logits of the batch alone are 4 x 512 x 100,352 float32
numbers: 784 MiB.

The fused loss is Liger-Kernel's Triton kernel, which needs a GPU; here
OLMo-core's head runs its fused path with tests/olmo_fused_cpu.py's CPU
stand-in of that kernel's algorithm (the same chunks of tokens, the
gradients made in the forward). The figures are that algorithm's memory on
a CPU, OLMo-core's own code around it, not Liger-Kernel's on a GPU.

    python research/bench_fused_loss.py --out research/results/fused_loss_memory.md
"""

import argparse
import ctypes
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB = 100_352  # OLMo 2's tokenizer (dolma2, 100,278 ids), padded to a multiple of 128
ARMS = (  # label, loss, natural bias with the gain
    ("stock, default loss", "default", False),
    ("stock, fused_linear", "fused", False),
    ("natbias + gain, default loss", "default", True),
    ("natbias + gain, fused_linear", "fused", True),
)


def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # MiB
    raise KeyError(key)


def measure(loss, natural, batch, length):
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    import numpy as np
    import olmo_fused_cpu
    import torch
    from olmo_core.data.utils import get_labels
    from olmo_core.nn.lm_head import LMLossImplementation
    from olmo_core.nn.transformer import TransformerConfig

    import natbias
    from natbias.olmo_core import _compat, add_natural_bias

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = TransformerConfig.olmo2_30M(vocab_size=VOCAB)
    if loss == "fused":
        config.lm_head.loss_implementation = LMLossImplementation.fused_linear
    model = config.build(init_device="cpu")
    weights = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)  # Zipfian ids
    ids = torch.multinomial(weights, batch * length, replacement=True).view(batch, length)
    labels = get_labels({"input_ids": ids})
    if natural:
        counts = np.bincount(labels[labels != -100].numpy(), minlength=VOCAB)
        add_natural_bias(model, counts=counts)
    model.init_weights(device=torch.device("cpu"))
    parameters = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20

    def step(ids, labels):
        model.zero_grad(set_to_none=True)
        output = model(
            ids,
            labels=labels,
            loss_reduction="sum",
            loss_div_factor=labels.numel(),
            z_loss_multiplier=1e-4,  # the fused loss adds it in OLMo-core 3.0 whether asked or not
        )
        output.loss.backward()
        return float(output.loss)

    with _compat.fused_linear_kernel(olmo_fused_cpu.fused_linear_cross_entropy):
        step(ids[:1, :64], labels[:1, :64])  # one-time allocations, before the reset
        # What the set-up freed back to the system, so that the step's peak is
        # counted from what is live, not from what malloc kept (it varied by
        # 230 MiB between arms without this).
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = status("VmRSS")
        value = step(ids, labels)
        peak = status("VmHWM")
    print(f"{parameters:.1f} {before:.1f} {peak:.1f} {value:.6f} {natbias.__file__}")


def run(loss, natural, batch, length):
    command = [sys.executable, __file__, "--child", loss, "--batch", str(batch)]
    command += ["--length", str(length)] + ["--natural"] * natural
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    parameters, before, peak, value, where = done.stdout.split()[-5:]
    assert where.startswith(str(REPO)), where  # this checkout's natbias
    return float(parameters), float(before), float(peak), float(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--natural", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=4, help="sequences a step")
    parser.add_argument("--length", type=int, default=512, help="tokens a sequence")
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    if args.child:
        measure(args.child, args.natural, args.batch, args.length)
        return
    logits = args.batch * args.length * VOCAB * 4 / 2**20
    growth, losses = {}, {}
    rows = ["| arm | parameters (MiB) | RSS before (MiB) | peak (MiB) | step's growth (MiB) |"]
    rows.append("|---|---|---|---|---|")
    for label, loss, natural in ARMS:
        parameters, before, peak, value = run(loss, natural, args.batch, args.length)
        growth[loss, natural], losses[loss, natural] = peak - before, value
        rows.append(
            f"| {label} | {parameters:.1f} | {before:.1f} | {peak:.1f} | {peak - before:+.1f} |"
        )
    rows += [
        "",
        "| | default loss (MiB) | fused_linear (MiB) | fused / default |",
        "|---|---|---|---|",
    ]
    for natural, label in ((False, "stock"), (True, "natbias + gain")):
        default, fused = growth["default", natural], growth["fused", natural]
        rows.append(f"| {label} | {default:+.1f} | {fused:+.1f} | {fused / default:.3f} |")
    gain = growth["fused", True] - growth["fused", False]
    rows += [
        "",
        f"The batch's logits: {logits:.0f} MiB. What the natural bias and the gain add to the "
        f"fused step: {gain:+.1f} MiB. Loss, default against fused_linear: stock "
        f"{losses['default', False]:.6f} / {losses['fused', False]:.6f}, natbias "
        f"{losses['default', True]:.6f} / {losses['fused', True]:.6f}.",
    ]
    import olmo_core.version
    import torch

    rows += [
        "",
        f"torch {torch.__version__}, OLMo-core {olmo_core.version.VERSION}, CPU, one thread; ",
    ]
    rows[-1] += f"command: {' '.join([Path(sys.executable).name, *sys.argv])}"
    print("\n".join(rows))
    if args.out:
        title = (
            "# Peak memory of a step: OLMo-core's fused_linear loss against its default loss\n\n"
        )
        Path(args.out).write_text(title + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
