"""Peak memory that add_natural_bias adds to a GPT-2-small-sized model
(transformers' GPT2Config() defaults: 12 layers, d 768, V 50,257, tied head),
today's in-place add against 1.0's copy and the float64 copy of W that the
measured start of the gain made after 2.1.0 (issue 94), each one's natbias
package taken from git at its commit, each in a fresh process, on the CPU.

The process's peak resident memory (VmHWM) is reset after the model is built
(/proc/self/clear_refs), so what it reads after add_natural_bias is the peak
of the add alone; growth = that peak - the resident memory before the add.

    .venv/bin/python research/hf_memory.py --out research/results/hf_memory.md
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Each arm: its label and the commit its natbias package comes from (None: this tree).
ARMS = (
    ("1.0 (copy)", "2a077f4"),  # 1.0.0, before the extra changed models in place
    # after 2.1.0, before issue 94: gain_start's F.linear(phi.double(), W.double())
    ("before issue 94 (float64 copy of W)", "578f5cd"),
    ("today (in place)", None),
)


def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024  # MiB
    raise KeyError(key)


def measure(package_root, warm_up):
    sys.path.insert(0, package_root)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import natbias.hf

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    parameters = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    if warm_up:  # the first forward's one-time allocations, before the reset
        with torch.no_grad():
            model.eval()(input_ids=torch.tensor([[0]]))
    counts = torch.ones(model.config.vocab_size, dtype=torch.int64).numpy()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    model = natbias.hf.add_natural_bias(model, counts=counts)
    peak = status("VmHWM")
    print(f"{parameters:.1f} {before:.1f} {peak:.1f} {natbias.__file__}")


def run(package_root, warm_up):
    done = subprocess.run(
        [sys.executable, __file__, "--child", package_root] + ["--warm-up"] * warm_up,
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    parameters, before, peak, where = done.stdout.split()[-4:]
    return float(parameters), float(before), float(peak), where


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the table here")
    warm_up = (
        "run the stock model on one token before the reset: the add's own growth, "
        "without the first forward's one-time allocations (add_natural_bias runs two)"
    )
    parser.add_argument("--warm-up", action="store_true", help=warm_up)
    args = parser.parse_args()
    if args.child:
        measure(args.child, args.warm_up)
        return
    rows = ["| add_natural_bias | parameters (MiB) | RSS before (MiB) | peak (MiB) | growth |"]
    rows.append("|---|---|---|---|---|")
    for arm, commit in ARMS:
        with tempfile.TemporaryDirectory() as folder:
            package_root = folder if commit else str(REPO)
            if commit:
                archive = subprocess.run(
                    ["git", "-C", str(REPO), "archive", commit, "natbias"],
                    capture_output=True,
                    check=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
            parameters, before, peak, where = run(package_root, args.warm_up)
            assert where.startswith(package_root), where
        growth = peak - before
        rows.append(
            f"| {arm} | {parameters:.1f} | {before:.1f} | {peak:.1f} | "
            f"{growth:+.1f} MiB ({100 * growth / parameters:.1f}% of the parameters) |"
        )
    import torch
    import transformers

    rows += ["", f"torch {torch.__version__}, transformers {transformers.__version__}, CPU; "]
    rows[-1] += f"command: {' '.join([Path(sys.executable).name, *sys.argv])}"
    print("\n".join(rows))
    if args.out:
        Path(args.out).write_text("# Peak memory of add_natural_bias\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
