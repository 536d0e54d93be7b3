"""natbias.olmo_core with OLMo-core's ``fused_linear`` loss and the gain: the
loss, the z-loss and the gradients of W, b, the gain and the whole trunk
equal the default loss's (the logits materialised, the projection's own
``W (g h) + b``), on one process (with or without a norm in the head; the
logits without labels too) and on 2 gloo processes under FSDP and under
tensor parallelism (there W's and b's gradients are OLMo-core's own
trouble, stock models' too: see the test).

OLMo-core 3.0's fused loss is Liger-Kernel's Triton kernel, which needs a
GPU (without Liger-Kernel OLMo-core raises "requires liger-kernel"). Here
OLMo-core's head runs its fused path with tests/olmo_fused_cpu.py's CPU
stand-in of that kernel's algorithm (``_compat.fused_linear_kernel``): what
is tested is the head's wiring, that the fused path is handed g h, W and b;
Liger-Kernel's own kernel is not.

    python tests/test_olmo_core_fused_loss.py STATE OUT   # the 2 gloo processes
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # the gloo processes run this file as a script
import olmo_fused_cpu  # noqa: E402

pytest.importorskip("olmo_core", reason="the [olmo] extra is not installed")

VOCAB = 1024  # the olmo2_1M preset's output layer, as in tests/olmo_tiny.py
BATCH, LENGTH = 8, 64
# OLMo-core's z-loss multiplier. Not left out: OLMo-core 3.0 hands Liger-Kernel
# ``z_loss_multiplier or 1e-4``, which it adds to the loss either way, so that
# without a z-loss the fused loss differs from the default by 1e-4 lse^2 (by
# 7e-4 of a stock olmo2_1M's loss at the start: OLMo-core's, not the gain's).
Z_LOSS = 1e-4

# Float32 rounding, derived: the two losses compute the same float32 numbers,
# and differ only in the order of two kinds of sums: over the vocabulary (the
# log-sum-exp of each token's logits, the gradient of h, sum_v dL/dz_v W_v)
# and over the tokens (W's and b's gradients, the chunks' partial sums added
# up). Two orders of a float32 sum of n terms differ by at most gamma_n =
# n u (u = 2^-24, the unit roundoff) of the sum of the terms' magnitudes
# (Higham, Accuracy and Stability of Numerical Algorithms, sec. 4.2); here n
# <= max(|V|, tokens) = 1,024, so every tensor is held to n u ~ 6.1e-5 of its
# norm. The trunk's gradients are the same float32 code on a gradient of h
# that differs by that much. (Measured: at most 1.2e-6, the gain's gradient.)
UNIT_ROUNDOFF = 2.0**-24
SUM_ORDER = max(VOCAB, BATCH * LENGTH) * UNIT_ROUNDOFF


def batch():
    """Zipfian ids, so that b is no constant, and OLMo-core's labels for them
    (the ids shifted left, the last -100: an ignored target)."""
    from olmo_core.data.utils import get_labels

    generator = torch.Generator().manual_seed(0)
    weights = 1.0 / torch.arange(1, 1001, dtype=torch.float64)
    ids = torch.multinomial(weights, BATCH * LENGTH, replacement=True, generator=generator)
    ids = ids.view(BATCH, LENGTH)
    return ids, get_labels({"input_ids": ids})


def target_counts(labels) -> np.ndarray:
    return np.bincount(labels[labels != -100].numpy(), minlength=VOCAB)


def build(fused: bool, norm: bool = True, meta: bool = False):
    """OLMo-core's olmo2_1M with the natural bias and the gain, its head's loss
    ``fused_linear`` or the default."""
    from olmo_core.nn.lm_head import LMLossImplementation
    from olmo_core.nn.transformer import TransformerConfig

    from natbias.olmo_core import add_natural_bias

    config = TransformerConfig.olmo2_1M(vocab_size=VOCAB)
    if fused:
        config.lm_head.loss_implementation = LMLossImplementation.fused_linear
    if not norm:
        config.lm_head.layer_norm = None
    model = config.build(init_device="meta" if meta else "cpu")
    return add_natural_bias(model, counts=target_counts(batch()[1]))


def loss_and_gradients(model, ids, labels, targets: int) -> dict:
    """OLMo-core's loss as its train module takes it (summed, divided by the
    targets of the whole batch, the z-loss added), then its backward: the
    losses and every parameter's gradient, whole."""
    from natbias.olmo_core import _compat

    model.zero_grad()
    with _compat.fused_linear_kernel(olmo_fused_cpu.fused_linear_cross_entropy):
        output = model(
            ids,
            labels=labels,
            loss_reduction="sum",
            loss_div_factor=float(targets),
            z_loss_multiplier=Z_LOSS,
        )
        output.loss.backward()
    from natbias.sharding import full

    return {
        "loss": full(output.loss.detach()),
        "ce_loss": full(output.ce_loss.detach()),
        "z_loss": full(output.z_loss.detach()),
        "gradients": {n: gradient(p) for n, p in model.named_parameters()},
    }


def gradient(parameter) -> torch.Tensor:
    """The whole gradient; zeros where none reached the parameter."""
    from natbias.sharding import full

    if parameter.grad is None:
        return torch.zeros(parameter.shape)
    return full(parameter.grad).detach().clone()


LOSSES = ("loss", "ce_loss", "z_loss")


def assert_same(fused: dict, default: dict, losses=LOSSES, skip=()) -> None:
    tolerance = SUM_ORDER
    for key in losses:
        assert float(fused[key]) == pytest.approx(float(default[key]), rel=tolerance), key
    assert fused["gradients"].keys() == default["gradients"].keys()
    for name, expected in default["gradients"].items():
        if name in skip:
            continue
        got = fused["gradients"][name]
        assert expected.norm() > 0, name  # every parameter, the gain's too, gets a gradient
        error = float((got - expected).norm() / expected.norm())
        assert error <= tolerance, (name, error)


HEAD_LINEAR = ("lm_head.w_out.weight", "lm_head.w_out.bias")


def same_pair(norm: bool = True):
    """The default-loss and the fused-loss model from the same parameters."""
    default, fused = build(False, norm), build(True, norm)
    torch.manual_seed(0)
    default.init_weights(device=torch.device("cpu"))  # b and the gain put back after
    fused.load_state_dict(default.state_dict())
    return default, fused


@pytest.mark.parametrize("norm", [True, False], ids=["head norm", "no head norm"])
def test_the_fused_loss_with_the_gain_equals_the_default_loss_and_its_gradients(norm):
    torch.set_num_threads(1)
    default, fused = same_pair(norm)
    gain = float(default.natbias_head.gain().detach())
    assert abs(gain - 1) > 0.5  # g far from 1: a path that left it out would show
    ids, labels = batch()
    targets = int((labels != -100).sum())
    expected = loss_and_gradients(default, ids, labels, targets)
    got = loss_and_gradients(fused, ids, labels, targets)
    print(f"g {gain:.3g}: loss {float(got['loss'] - expected['loss']):+.2e} off the default's")
    assert_same(got, expected)
    with torch.no_grad():  # no labels: the logits, by the projection, g applied once
        logits = default(ids)
        scores = logits - default.natbias_head.bias  # W g h, what g scales
        assert float((fused(ids) - logits).norm() / scores.norm()) <= SUM_ORDER


# --- 2 gloo processes: FSDP, tensor parallelism ---------------------------------


def run_on_two_processes(state_path, out):
    """Each process: both models built on the meta device, parallelised by
    OLMo-core's train module, the parameters of ``state_path`` loaded, then
    a forward and backward: under FSDP its half of the batch (the losses
    summed over the ranks), under tensor parallelism the whole batch. Rank 0
    writes the losses and the whole gradients to ``out``."""
    import olmo_core.distributed.parallel as olmo_parallel
    import olmo_tiny
    import torch.distributed as dist
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.train.train_module import (
        TransformerDataParallelConfig,
        TransformerTensorParallelConfig,
    )
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from natbias.sharding import is_dtensor

    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    ids, labels = batch()
    targets = int((labels != -100).sum())
    fsdp = TransformerDataParallelConfig(name=DataParallelType.fsdp)
    modes = {  # OLMo-core wants a data-parallel config beside TP: degree 2 / 2 = 1
        "fsdp": dict(dp_config=fsdp),
        "tp": dict(dp_config=fsdp, tp_config=TransformerTensorParallelConfig(degree=world)),
    }
    results, sharded = {}, {}
    for mode, parallel in modes.items():
        share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        share = share if mode == "fsdp" else slice(None)
        for name, fused in (("default", False), ("fused", True)):
            olmo_parallel._WORLD_MESH = None  # one train module per model in this process
            model = build(fused, meta=True)
            olmo_tiny.train_module(model, warmup=None, batch=BATCH // world, **parallel)
            state = torch.load(state_path)  # afresh: set_model_state_dict shards it in place
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
            weight = model.blocks["0"].attention.w_q.weight
            sharded[mode, name] = is_dtensor(weight) and weight.to_local().numel() < weight.numel()
            result = loss_and_gradients(model, ids[share], labels[share], targets)
            if mode == "fsdp":
                for key in ("loss", "ce_loss", "z_loss"):  # each rank's share of the loss
                    dist.all_reduce(result[key])
            results[mode, name] = result
    if rank == 0:
        torch.save({"results": results, "sharded": sharded}, out)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The one-process default loss, and both losses on 2 gloo processes
    under FSDP and TP, from the same parameters."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("olmo_fused")
    default, _ = same_pair()
    torch.save(default.state_dict(), root / "state.pt")
    ids, labels = batch()
    single = loss_and_gradients(default, ids, labels, int((labels != -100).sum()))
    launch = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NUM_NODES"}
    launch |= {"MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in launch and not k.startswith("OLMO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, __file__, str(root / "state.pt"), str(root / "out.pt")]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return single, torch.load(root / "out.pt")


@pytest.mark.training  # OLMo-core's train module on 2 processes
@pytest.mark.parametrize("mode", ["fsdp", "tp"])
def test_on_two_gloo_processes_the_fused_loss_equals_the_default(two_processes, mode):
    single, gloo = two_processes
    assert gloo["sharded"][mode, "default"] and gloo["sharded"][mode, "fused"]  # really split
    default, fused = gloo["results"][mode, "default"], gloo["results"][mode, "fused"]
    print(f"{mode}: loss {float(fused['loss'] - default['loss']):+.2e} off the default's")
    # Under tensor parallelism OLMo-core 3.0's fused path hands the kernel the
    # local W and b of their replicated DTensors (get_local_tensor), so that
    # each rank's W and b get the gradient of its sequence shard only, never
    # summed: 0.64 of the whole W gradient's norm off it here, a stock model's
    # alike. OLMo-core's, not the gain's: everything else is compared.
    assert_same(fused, default, skip=HEAD_LINEAR if mode == "tp" else ())
    # the parallel default loss is one process's: the shares are real. FSDP
    # averages the 2 ranks' gradients of their halves of the batch's loss.
    # Under TP the logged ce_loss and z_loss are rank 0's sequence shard's.
    ranks, losses = (2, LOSSES) if mode == "fsdp" else (1, ["loss"])
    share = {n: g / ranks for n, g in single["gradients"].items()}
    assert_same(default, {**single, "gradients": share}, losses)


if __name__ == "__main__":  # python tests/test_olmo_core_fused_loss.py STATE OUT
    from olmo_core.testing.distributed import run_distributed_test

    run_distributed_test(run_on_two_processes, world_size=2, backend="gloo", func_args=sys.argv[1:])
