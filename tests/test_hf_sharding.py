"""A natural-bias model trains sharded as it trains in one process: FSDP2
(a causal and a sequence-to-sequence model), FSDP1 (with and without an
auto-wrap policy), transformers' tensor parallelism, a model built on the
meta device, given the bias there, sharded, then materialised, and DeepSpeed
ZeRO-3 (where DeepSpeed is installed). 2 torchrun processes over gloo (CPU)
against one process on the same global batch, from the same weights: the
loss of every update, then b, the gain and W (relative 1e-5) and the bias
statistics (computed by every process, and logged by a real Trainer's
callbacks, which it hands the model it was given, not FSDP1's wrapper).
Each case also asserts that the parameters really were sharded, so that a
silent fall-back to replication fails it. The runs: tests/hf_shard_worker.py."""

import math
import os
import subprocess

import pytest
import torch

pytest.importorskip("transformers")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import hf_shard_worker as worker  # noqa: E402
import hf_tiny  # noqa: E402
from natbias_testing import REPO, free_port, script_python  # noqa: E402

RELATIVE = 1e-5
LOGGED = 0.5e-4  # a logged statistic is rounded to 4 decimals: by half a unit of the last


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """Every case, run once by 2 processes (rank 0's results by case)."""
    out = tmp_path_factory.mktemp("sharded")
    command = [
        *(script_python(), "-m", "torch.distributed.run", "--nproc_per_node", "2"),
        *("--master_port", str(free_port())),
        str(REPO / "tests" / "hf_shard_worker.py"),
        str(out),
    ]
    # This tree's natbias, not the installed copy; DeepSpeed on its CPU accelerator.
    env = {**os.environ, "PYTHONPATH": str(REPO), "DS_ACCELERATOR": "cpu"}
    # Under a timeout: a collective that only some processes reach hangs.
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return {case: torch.load(out / f"{case}.pt", weights_only=False) for case in worker.CASES}


def one_process(sharded: dict, family: str) -> dict:
    """The same updates in one process, from the weights the sharded run started with."""
    model = worker.fresh_model(family)
    model.load_state_dict(sharded["initial"])
    return worker.train(model)


def assert_same_statistics(ours: dict, theirs: dict, rounding: float = 0.0) -> None:
    """Each statistic within RELATIVE of the other; a divergence (bias_kl,
    kl_*, in bits) within RELATIVE of log2 |V| more: it is the difference of
    two cross-entropies of about that size, whose float rounding it keeps.
    ``rounding``: what rounding ``ours`` for the log may have moved it by."""
    for key, value in theirs.items():
        scale = abs(value) + (math.log2(hf_tiny.V) if "kl" in key else 0.0)
        assert abs(ours[key] - value) <= rounding + RELATIVE * scale, (key, ours[key], value)


def relative(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.training
@pytest.mark.parametrize("case", list(worker.CASES))
def test_sharded_training_is_one_process_training(sharded_runs, case):
    sharded = sharded_runs[case]
    family = worker.CASES[case][0]
    alone = one_process(sharded, family)
    assert len(sharded["losses"]) == worker.UPDATES
    assert sharded["losses"] == pytest.approx(alone["losses"], rel=RELATIVE)
    for name in ("bias", "gain", "weight"):
        assert sharded[name].shape == alone[name].shape
        assert relative(sharded[name], alone[name]) < RELATIVE, name
    # The statistics, computed on every process (b and W gathered, the
    # probe's forward run by each), are one process's; the Trainer logs them,
    # its callbacks given the model it was given (not FSDP1's wrapper).
    assert_same_statistics(sharded["stats"], alone["stats"])
    assert_same_statistics(sharded["trainer"]["logged"], alone["stats"], rounding=LOGGED)
    assert sharded["stats"]["gain"] > 0.05  # trained: the gain moved from its start


@pytest.mark.parametrize(
    "case", [c for c, (_, engine) in worker.CASES.items() if "fsdp2" in engine]
)
@pytest.mark.training
def test_fsdp2_shards_every_parameter_b_and_the_gain_included(sharded_runs, case):
    shards = sharded_runs[case]["sharded"]
    model = worker.fresh_model(worker.CASES[case][0])
    names = {name for name, _ in model.named_parameters()}
    assert set(shards) == names
    assert all(placement == "(Shard(dim=0),)" for placement, _, _ in shards.values())
    head = "final_logits_bias" if "final_logits_bias" in names else "lm_head.bias"
    for name in (head, "lm_head.gain_param"):
        assert name in shards
    _, local, whole = shards[
        next(n for n in names if n.endswith("embed_tokens.weight") or n == "model.shared.weight")
    ]
    assert local == whole // 2  # rank 0 holds half of the vocabulary's rows


@pytest.mark.training
@pytest.mark.parametrize("case, wrappers", [("fsdp1-gpt2", 1), ("fsdp1-wrap-gpt2", 2)])
def test_fsdp1_holds_half_the_flat_parameters(sharded_runs, case, wrappers):
    shards = sharded_runs[case]["sharded"]
    assert shards["total"] // 2 <= shards["flat"] <= shards["total"] // 2 + 2
    assert shards["wrappers"] == wrappers  # the root, and the block the policy wrapped


@pytest.mark.training
@pytest.mark.parametrize("case", list(worker.CASES))
def test_a_callback_that_cannot_find_fsdp1s_wrapper_is_refused_in_one_line(sharded_runs, case):
    """Given in ``callbacks=``, the callback has only the model the Trainer
    hands it: under FSDP1 it is refused as training begins, naming
    log_bias_statistics (which reads trainer.model_wrapped); elsewhere it runs."""
    refusal = sharded_runs[case]["trainer"]["refusal"]
    if worker.CASES[case][1].startswith("fsdp1"):
        assert refusal.startswith("this model is sharded by FSDP1, whose wrapper cannot be found")
        assert "natbias.hf.log_bias_statistics(trainer)" in refusal and "\n" not in refusal
    else:
        assert refusal == "not refused"


@pytest.mark.training
def test_tensor_parallelism_splits_b_with_the_heads_vocabulary(sharded_runs):
    sharded = sharded_runs["tp-llama"]
    shards = sharded["sharded"]
    assert shards["lm_head.weight"] == ("(Shard(dim=0),)", 20 * 16, 40 * 16)
    assert shards["lm_head.bias"] == ("(Shard(dim=0),)", 20, 40)
    assert "lm_head.gain_param" not in shards  # one g, whole on each process
    model = worker.fresh_model("llama")
    model.load_state_dict(sharded["initial"])
    with torch.no_grad():
        alone = model.eval()(input_ids=worker.batches()[0][:2]).logits
    torch.testing.assert_close(sharded["logits"], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.training
def test_a_model_built_on_the_meta_device_takes_its_values_when_initialised(sharded_runs):
    """Built on meta, given the bias, sharded, then to_empty and init_weights:
    b and the prior are the counted log-unigram, the gain its default start."""
    sharded = sharded_runs["meta-fsdp2-llama"]
    reference = worker.fresh_model("llama").state_dict()
    initial = sharded["initial"]
    for name in ("lm_head.bias", "natbias_log_prior", "lm_head.gain_param"):
        torch.testing.assert_close(initial[name], reference[name], rtol=0, atol=1e-6)
    assert initial["lm_head.gain_param"].item() * 20 == pytest.approx(0.05)
    # The random weights were drawn (not left as to_empty's memory): a fresh start.
    assert 0 < initial["model.embed_tokens.weight"].std().item() < 0.1


@pytest.mark.training
def test_the_wrong_order_is_refused_in_one_line_naming_the_right_one(sharded_runs):
    refusals = sharded_runs["meta-fsdp2-llama"]["refusals"]
    after = refusals["add_natural_bias after sharding"]
    assert "is sharded already: add the natural bias before sharding" in after
    assert "then to_empty and init_weights" in after
    uninitialised = refusals["forward before initialisation"]
    assert "after to_empty, call model.init_weights()" in uninitialised
    assert all("\n" not in message for message in refusals.values())


@pytest.mark.training
def test_deepspeed_zero_3_partitions_every_parameter_b_and_the_gain_included(sharded_runs):
    """ZeRO-3 on DeepSpeed's CPU accelerator: rank 0 holds half of each
    parameter (rounded up); the statistics are gathered with GatheredParameters."""
    if "zero3-gpt2" not in sharded_runs:
        pytest.skip("DeepSpeed is not installed (.venv/bin/pip install deepspeed: docs/scaling.md)")
    shards = sharded_runs["zero3-gpt2"]["sharded"]
    names = {name for name, _ in worker.fresh_model("gpt2").named_parameters()}
    assert set(shards) == names and {"lm_head.bias", "lm_head.gain_param"} <= names
    assert all(local == -(-whole // 2) for local, whole in shards.values())
