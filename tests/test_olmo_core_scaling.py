"""natbias.olmo_core under OLMo-core's own ways of scaling, on CPU: 2 gloo
processes (tests/olmo_gloo_worker.py) against one, from the same initial
state (docs/pretraining.md):

- FSDP and tensor parallelism equal one process within 1e-5, the loss
  before and after an update, b and the gain, with W really sharded; HSDP
  (2 replicas of 1 shard) too;
- b's master copy stays float32 under FSDP's bf16 parameters;
- the statistics, gathered from the shards, reach OLMo-core's metrics;
- a run resumed from OLMo-core's distributed checkpoint equals, to the last
  bit, the run that saved it and went on.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import olmo_tiny
import pytest
import torch

torch.set_num_threads(1)
pytestmark = pytest.mark.training  # OLMo-core's Trainer, on 1 and 2 processes
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


# --- OLMo-core's own scaling: 2 gloo processes against 1 ------------------------

# The variables a single-process OLMo-core run in this process sets for itself,
# which would make the 2 processes' group a group of 1.
LAUNCH_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NUM_NODES"}
LAUNCH_VARIABLES |= {"MASTER_ADDR", "MASTER_PORT"}


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    return olmo_tiny.multi30k_token_files(tmp_path_factory)


@pytest.fixture(scope="module")
def gloo(token_files, tmp_path_factory):
    """One update on 1 process here; on 2 gloo processes under FSDP, HSDP
    (2 replicas of 1 shard), TP, FSDP with bf16 parameters, and 2 updates
    resumed from OLMo-core's checkpoint after the first, against 2 updates
    without one (tests/olmo_gloo_worker.py), all from the same initial state."""
    import olmo_gloo_worker

    root = tmp_path_factory.mktemp("olmo_gloo")
    paths = {name: str(path) for name, path in token_files.items()}
    single = olmo_gloo_worker.one_run(paths, str(root / "single"))
    initial, out = root / "single-initial.pt", root / "gloo.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCH_VARIABLES and not k.startswith("OLMO_")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, str(TESTS / "olmo_gloo_worker.py"), paths["train"], paths["val"]]
    command += [str(root / "gloo"), str(out), str(initial)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    return single, json.loads(out.read_text()), torch.load(initial)


# u (the gain's parameter) after one update on 1 process and on 2. AdamW's
# first step from m = v = 0 is lr g / (|g| + eps), bias-corrected: lr sign(g)
# short by lr kappa, kappa = eps / (|g| + eps), read from the run as
# 1 - |u1 - u0| / lr. u's gradient g sums over the 1024 logits (W^T dz), then
# over every position and feature (BATCH x 64 x d): N terms, which the layouts
# sum in other orders, each moving g by at most N u of itself (gamma_N, no
# cancellation; u = 2^-24), so the step by lr kappa 2 N u. Each run's own step
# rounds about 12 times (olmo_core's adamw_step: the moments, bias
# corrections, sqrt, eps, the division and the product by lr /
# bias_correction1), each by u of lr, and u1 = u0 - step once more by u |u1|.
# Adam's first step on b is the same with kappa <= 1 and 1024 + BATCH x 64
# terms, each entry rounded by u |b|.
FLOAT32_UNIT = 2.0**-24
LR, POSITIONS = 1e-2, 8 * olmo_tiny.SEQUENCE_LENGTH  # tests/olmo_gloo_worker.py's LR, BATCH


def gain_param_margin(u0, u1, features):
    kappa = 1 - abs(u1 - u0) / LR
    gradient = LR * kappa * 2 * (1024 + POSITIONS * features) * FLOAT32_UNIT
    return gradient + 2 * (12 * FLOAT32_UNIT * LR + FLOAT32_UNIT * abs(u1))


def bias_margin(b):
    gradient = LR * 2 * (1024 + POSITIONS) * FLOAT32_UNIT
    return gradient + 2 * FLOAT32_UNIT * (12 * LR + np.abs(b).max())


@pytest.mark.parametrize("mode", ["fsdp", "hsdp", "tp"])
def test_two_gloo_processes_equal_one_within_1e_5(gloo, mode):
    single, runs, initial = gloo
    run = runs[mode]
    print(
        f"{mode}: loss before {run['before'] - single['before']:+.2e}, after {run['after'] - single['after']:+.2e} (nats) off one process"
    )
    assert abs(single["after"] - single["before"]) > 1e-4  # the update changes the loss
    assert run["before"] == pytest.approx(single["before"], abs=1e-5)
    assert run["after"] == pytest.approx(single["after"], abs=1e-5)
    np.testing.assert_allclose(run["bias"], single["bias"], atol=bias_margin(single["bias"]))
    (u0,), (u1,) = initial["lm_head.w_out.gain_param"].tolist(), single["gain_param"]
    assert abs(abs(u1 - u0) - LR) < 1e-3 * LR  # lr sign(g)
    margin = gain_param_margin(u0, u1, initial["lm_head.w_out.weight"].shape[1])
    np.testing.assert_allclose(run["gain_param"], single["gain_param"], atol=margin, rtol=0)
    local, whole = run["sharded"]
    assert local == (whole if mode == "hsdp" else whole // 2)  # HSDP: 2 replicas of 1 shard
    # the statistics, gathered from the shards, as one process reports them:
    # g = 20 |u| within u's margin (and g's own rounding), the others within
    # 1e-5 of their size
    for name, value in single["natbias"].items():
        if name == "natbias/gain":
            allowed = 20 * margin + 2 * FLOAT32_UNIT * value
            assert run["natbias"][name] == pytest.approx(value, rel=0, abs=allowed)
            assert value == pytest.approx(20 * abs(u1), rel=2 * FLOAT32_UNIT)
        else:
            assert run["natbias"][name] == pytest.approx(value, rel=1e-5, abs=0), name
    assert set(single["natbias"]) == {
        f"natbias/{n}" for n in ("bias_kl", "bias_norm", "weight_norm", "gain")
    }


def test_b_stays_float32_under_bf16_mixed_precision(gloo):
    _, runs, initial = gloo
    run = runs["fsdp_bf16"]
    assert run["bias_dtype"] == "torch.float32" and run["sharded"][0] * 2 == run["sharded"][1]
    b0 = initial["lm_head.w_out.bias"].double().numpy()
    step = np.asarray(run["bias"]) - b0
    rare = np.abs(b0) > 8  # where bfloat16's spacing is 0.0625: a step of lr = 0.01 would be lost
    assert rare.sum() > 10 and (np.abs(step[rare]) > 1e-3).mean() > 0.9
    assert np.abs(step).max() < 0.0625 / 2


def test_olmo_cores_checkpoint_saves_and_resumes_the_natural_bias(gloo):
    """Resumed from the checkpoint of step 1 (it takes step 2 alone), the run
    equals the run that saved that checkpoint and went on: the same
    processes, kernels and batches from float32 parameters and optimizer
    state, the same arithmetic in the same order, so to the last bit (no
    margin)."""
    _, runs, _ = gloo
    resumed, saved = runs["resumed"], runs["saved"]
    assert resumed["steps_taken"] == [2] and saved["steps_taken"] == [1, 2]
    assert resumed["step"] == saved["step"] == 2
    assert resumed["after"] == saved["after"]
    assert resumed["bias"] == saved["bias"]
    assert resumed["gain_param"] == saved["gain_param"]
    assert resumed["natbias"] == saved["natbias"]
