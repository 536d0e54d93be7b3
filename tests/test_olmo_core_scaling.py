"""natbias.olmo_core under OLMo-core's own ways of scaling, on CPU: 2 gloo
processes (tests/olmo_gloo_worker.py) against one, from the same initial
state (docs/pretraining.md):

- FSDP and tensor parallelism equal one process within 1e-5, the loss
  before and after an update, b and the gain, with W really sharded; HSDP
  (2 replicas of 1 shard) too;
- b's master copy stays float32 under FSDP's bf16 parameters;
- the statistics, gathered from the shards, reach OLMo-core's metrics;
- a run resumed from OLMo-core's distributed checkpoint equals one that was not stopped.
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


@pytest.mark.parametrize("mode", ["fsdp", "hsdp", "tp"])
def test_two_gloo_processes_equal_one_within_1e_5(gloo, mode):
    single, runs, _ = gloo
    run = runs[mode]
    print(
        f"{mode}: loss before {run['before'] - single['before']:+.2e}, after {run['after'] - single['after']:+.2e} (nats) off one process"
    )
    assert abs(single["after"] - single["before"]) > 1e-4  # the update changes the loss
    assert run["before"] == pytest.approx(single["before"], abs=1e-5)
    assert run["after"] == pytest.approx(single["after"], abs=1e-5)
    np.testing.assert_allclose(run["bias"], single["bias"], atol=1e-5)
    np.testing.assert_allclose(run["gain_param"], single["gain_param"], atol=1e-7)
    local, whole = run["sharded"]
    assert local == (whole if mode == "hsdp" else whole // 2)  # HSDP: 2 replicas of 1 shard
    # the statistics, gathered from the shards, as one process reports them
    for name, value in single["natbias"].items():
        assert run["natbias"][name] == pytest.approx(value, rel=1e-5, abs=1e-8), name
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
    _, runs, _ = gloo
    resumed, uninterrupted = runs["resumed"], runs["uninterrupted"]
    assert resumed["step"] == uninterrupted["step"] == 2
    assert resumed["after"] == pytest.approx(uninterrupted["after"], abs=1e-6)
    np.testing.assert_allclose(resumed["bias"], uninterrupted["bias"], atol=1e-6)
    np.testing.assert_allclose(resumed["gain_param"], uninterrupted["gain_param"], atol=1e-8)
    assert resumed["natbias"] == pytest.approx(uninterrupted["natbias"], rel=1e-6)
