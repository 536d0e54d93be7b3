"""Scaling out a fairseq run changes nothing but speed: 2 ranks joined over
gloo (the recipes' CPU launcher: legacy_ddp) train the model 1 rank trains
with ``--update-freq 2``, log the same ``train_inner`` lines and save the
same b, gain and weights; a checkpoint written by either resumes on the
other and goes on as the uninterrupted run. Real fairseq-train processes on
a Multi30k slice, dropout 0."""

import os
import subprocess

import pytest
import torch
from natbias_testing import BIN, REPO, TINY_MODEL, TINY_TRAINING, free_port, log_records

NOT_COMPARED = {"wps", "ups", "wall", "train_wall", "gb_free"}  # timing and memory
PRINTED = 1.1e-3  # one unit of the third decimal, the precision fairseq prints
WEIGHTS = 1e-6

SAME_BATCHES = [
    "--dropout", "0", "--lr", "5e-3", "--batch-size", "8", "--max-tokens", "100000",
    "--required-batch-size-multiple", "1", "--max-update", "6",
    "--save-interval-updates", "3", "--keep-interval-updates", "-1",
]  # fmt: skip
# Each feature of the plugin that touches the loss or the output layer, in three runs.
CONFIGURATIONS = {
    "unigram-ls-bigram": [
        "--criterion", "unigram_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--natbias-order", "2",
    ],
    "unigram-reg-zero": [
        "--criterion", "unigram_regularized_cross_entropy", "--unigram-reg-weight", "0.5",
        "--unigram-reg-updates", "4", "--natbias-init", "zero",
    ],
    "no-bias": ["--natbias-init", "none"],
}  # fmt: skip


def command(data, save_dir, extra):
    return [
        str(BIN / "fairseq-train"), str(data), "--user-dir", "fairseq_natbias",
        "--arch", "transformer_natbias", *TINY_MODEL, *TINY_TRAINING, *SAME_BATCHES,
        *extra, "--save-dir", str(save_dir),
    ]  # fmt: skip


def ranks(data, save_dir, extra, world):
    """The commands of one run: 1 rank with --update-freq 2, or 2 ranks over gloo."""
    if world == 1:
        return [command(data, save_dir, [*extra, "--update-freq", "2"])]
    join = [
        "--distributed-world-size", "2", "--distributed-init-method",
        f"tcp://127.0.0.1:{free_port()}", "--distributed-no-spawn",
        "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
    ]  # fmt: skip
    return [command(data, save_dir, [*extra, *join, "--distributed-rank", r]) for r in "01"]


def run_all(commands):
    """Runs the commands side by side; rank 0's (each run's first) output."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    started = [
        subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for c in commands
    ]  # fmt: skip
    try:
        outputs = [process.communicate(timeout=300)[0] for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
    for process, output in zip(started, outputs):
        assert process.returncode == 0, output[-3000:]
    return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory, multi30k_bin):
    """Every configuration on 1 rank and on 2, all at once; the first
    configuration's checkpoints at update 3 resumed on the other world size."""
    root = tmp_path_factory.mktemp("scale_out")
    plan = [(name, world) for name in CONFIGURATIONS for world in (1, 2)]
    commands = [ranks(multi30k_bin, root / f"{n}-{w}", CONFIGURATIONS[n], w) for n, w in plan]
    outputs = run_all([c for run in commands for c in run])
    logs, at = {}, 0
    for (name, world), run in zip(plan, commands):
        logs[name, world] = outputs[at]
        at += len(run)
    first = next(iter(CONFIGURATIONS))
    resumes = [
        ranks(multi30k_bin, root / f"resumed-on-{world}", [*CONFIGURATIONS[first], "--restore-file",
              str(root / f"{first}-{3 - world}" / "checkpoint_1_3.pt")], world)
        for world in (1, 2)
    ]  # fmt: skip
    outputs = run_all([c for run in resumes for c in run])
    logs["resumed", 1], logs["resumed", 2] = outputs[0], outputs[1]
    return root, logs


def assert_same_lines(ours, theirs):
    assert len(ours) == len(theirs) and ours
    for mine, other in zip(ours, theirs):
        keys = set(mine) - NOT_COMPARED
        assert keys == set(other) - NOT_COMPARED
        for key in sorted(keys):
            assert mine[key] == pytest.approx(other[key], abs=PRINTED), key


def model_state(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


@pytest.mark.training
@pytest.mark.parametrize("name", CONFIGURATIONS)
def test_two_ranks_train_what_one_rank_trains_with_update_freq_2(runs, name):
    root, logs = runs
    one, two = log_records(logs[name, 1]), log_records(logs[name, 2])
    assert len(one) == 6 and [r["bsz"] for r in two] == [16.0] * 6  # both ranks' batches summed
    assert "training on 2 devices" in logs[name, 2]
    assert_same_lines(two, one)
    ours, theirs = (
        model_state(root / f"{name}-2/checkpoint_last.pt"),
        model_state(root / f"{name}-1/checkpoint_last.pt"),
    )
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.allclose(ours[key].float(), theirs[key].float(), atol=WEIGHTS, rtol=0), key
    if name == "no-bias":
        assert "decoder.output_projection.bias" not in ours
    else:
        bias = ours["decoder.output_projection.bias"]
        start = model_state(root / f"{name}-1/checkpoint_1_3.pt")["decoder.output_projection.bias"]
        assert not torch.equal(bias, start)  # b trained, and alike on both


@pytest.mark.training
@pytest.mark.parametrize("world", [1, 2])
def test_a_checkpoint_resumes_on_the_other_world_size_as_uninterrupted(runs, world):
    root, logs = runs
    first = next(iter(CONFIGURATIONS))
    resumed = log_records(logs["resumed", world])
    assert [r["num_updates"] for r in resumed] == [4.0, 5.0, 6.0]
    assert_same_lines(resumed, log_records(logs[first, 1])[3:])
    ours = model_state(root / f"resumed-on-{world}/checkpoint_last.pt")
    theirs = model_state(root / f"{first}-1/checkpoint_last.pt")
    for key in ours:
        assert torch.allclose(ours[key].float(), theirs[key].float(), atol=WEIGHTS, rtol=0), key
