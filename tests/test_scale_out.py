"""Scaling out a fairseq run changes nothing but speed: 2 ranks joined over
gloo (the recipes' CPU launcher: legacy_ddp) train the model 1 rank trains
with ``--update-freq 2``, log the same ``train_inner`` lines and save the
same b, gain and weights; a checkpoint written at the end of an epoch by
either resumes on the other and goes on as it does on its own world size.
Real fairseq-train processes on the toy corpus (an epoch is 3 updates),
dropout 0, served by the run's fork server (tests/fork_server.py).

Mid-epoch, fairseq 0.12 counts the batches each rank has read: a checkpoint
written by N ranks resumed on M skips N/M times the batches it should
(docs/scaling.md)."""

import os
import subprocess
import time

import pytest
import torch
from natbias_testing import REPO, TINY_MODEL, TINY_TRAINING, command_of, free_port, log_records

NOT_COMPARED = {"wps", "ups", "wall", "train_wall", "gb_free", "ppl"}  # timing; ppl = 2^nll_loss
PRINTED = 1.1e-3  # one unit of the third decimal, the precision fairseq prints
# Each tensor relative to its norm: the float rounding of sums taken in another
# order is relative to the sizes summed, whatever the vector kernels.
WEIGHTS = 1e-5
# An attention's key bias adds the same to every score of a query, which
# softmax cancels: its true gradient is 0 in every attention (the decoder's
# self-attention and its attention over the encoder alike), and Adam, which
# divides by the gradient's own scale, turns the float rounding of a sum taken
# in another order (two ranks' halves, or one rank's two steps) into steps of
# up to a learning rate. Measured: 1.0e-6 apart after 6 updates here, more
# with other vector kernels. So every key projection's bias (fairseq's
# MultiheadAttention names it k_proj) is held to NO_GRADIENT; every other
# parameter, b and the gain among them, to WEIGHTS (relative).
KEY_BIAS = ".k_proj.bias"
NO_GRADIENT = 1e-4


def assert_same_weights(path, other):
    ours, theirs = model_state(path), model_state(other)
    assert ours.keys() == theirs.keys()
    # One key bias per attention (each has one query projection): the rule
    # cannot miss an attention that fairseq names otherwise.
    attentions = [key for key in ours if key.endswith(".q_proj.weight")]
    assert len([key for key in ours if key.endswith(KEY_BIAS)]) == len(attentions) > 0
    for key in ours:
        if key.endswith(KEY_BIAS):
            assert torch.allclose(ours[key].float(), theirs[key].float(), atol=NO_GRADIENT), key
            continue
        a, b = ours[key].double(), theirs[key].double()
        assert ((a - b).norm() / b.norm()).item() < WEIGHTS, key


# The toy corpus's 400 pairs in 6 batches of at most 67: an epoch is 3 updates on
# 1 rank with --update-freq 2 and on 2 ranks. The learning rate from update 1 on.
SAME_BATCHES = [
    "--dropout", "0", "--lr", "5e-3", "--warmup-updates", "1", "--warmup-init-lr", "5e-3",
    "--batch-size", "67", "--max-tokens", "100000", "--required-batch-size-multiple", "1",
]  # fmt: skip
EPOCH = 3
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
        "fairseq-train", str(data), "--user-dir", "fairseq_natbias",
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


def run_all(commands, work, timeout=300):
    """Runs the commands side by side, each a fairseq-train process of its own
    (forked by the fork server, tests/fork_server.py); their outputs. When one
    fails the others are stopped: a rank would wait for it."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    outputs = [work / f"{i}.log" for i in range(len(commands))]
    processes = []
    for (tool, *arguments), output in zip(commands, outputs):
        with open(output, "w") as log:
            processes.append(
                subprocess.Popen(
                    [*command_of(tool), *arguments], cwd=REPO, env=env, stdout=log, stderr=log
                )
            )
    deadline = time.time() + timeout
    try:
        while any(p.poll() is None for p in processes) and not failed(processes):
            if time.time() > deadline:
                raise AssertionError(f"the processes did not finish in {timeout} s")
            time.sleep(0.1)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()  # a served command's process is stopped with it
            process.wait()
    texts = [o.read_text() for o in outputs]
    assert not failed(processes), "\n".join(t[-3000:] for t in texts)
    return texts


def failed(processes):
    return any(p.returncode not in (None, 0) for p in processes if p.poll() is not None)


def launch(plan, data, root, extra):
    """Each (name, world) of ``plan`` run side by side: rank 0's output by name."""
    commands = [ranks(data, root / f"{n}-{w}", [*extra(n), *more], w) for n, w, *more in plan]
    work = root / f"launch-{len(list(root.glob('launch-*')))}"
    work.mkdir()
    outputs = iter(run_all([c for run in commands for c in run], work))
    logs = {}
    for (name, world, *_), run in zip(plan, commands):
        logs[name, world] = next(outputs)
        for _ in run[1:]:
            next(outputs)
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory, toy_bin):
    """Every configuration for one epoch on 1 rank and on 2, all at once; then
    the first configuration to the end of epoch 2 from each of its
    checkpoints on 1 rank, and from 1 rank's on 2."""
    root = tmp_path_factory.mktemp("scale_out")
    plan = [(n, w, "--max-update", str(EPOCH)) for n in CONFIGURATIONS for w in (1, 2)]
    logs = launch(plan, toy_bin, root, CONFIGURATIONS.get)
    first = next(iter(CONFIGURATIONS))
    plan = [
        (f"from{written}", world, "--max-update", str(2 * EPOCH), "--restore-file",
         str(root / f"{first}-{written}/checkpoint_last.pt"))
        for written, world in ((1, 1), (2, 1), (1, 2))
    ]  # fmt: skip
    logs.update(launch(plan, toy_bin, root, lambda _: CONFIGURATIONS[first]))
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
    assert len(one) == EPOCH and sum(r["bsz"] for r in two) == 400  # both ranks' batches summed
    assert "training on 2 devices" in logs[name, 2]
    assert_same_lines(two, one)
    assert_same_weights(
        root / f"{name}-2/checkpoint_last.pt", root / f"{name}-1/checkpoint_last.pt"
    )
    ours = model_state(root / f"{name}-2/checkpoint_last.pt")
    if name == "no-bias":
        assert "decoder.output_projection.bias" not in ours
    else:
        bias = ours["decoder.output_projection.bias"]
        start = model_state(root / "from1-1/checkpoint_last.pt")["decoder.output_projection.bias"]
        assert name != "unigram-ls-bigram" or not torch.equal(bias, start)  # b trains


@pytest.mark.training
@pytest.mark.parametrize("written, world", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_the_other_world_size_as_on_its_own(runs, written, world):
    """Resumed on the other world size at an epoch's end, a run goes on as
    resumed on its own. (Resumed at all, fairseq 0.12 does not go on exactly
    as the uninterrupted run, with stock fairseq's own model too: docs/scaling.md.)"""
    root, logs = runs
    again = log_records(logs[f"from{written}", world])
    assert "Loaded checkpoint" in logs[f"from{written}", world]
    assert [r["num_updates"] for r in again] == [4.0, 5.0, 6.0]
    assert_same_lines(again, log_records(logs["from1", 1]))
    assert_same_weights(
        root / f"from{written}-{world}/checkpoint_last.pt", root / "from1-1/checkpoint_last.pt"
    )


def test_a_failed_process_stops_the_launch_and_its_peers(tmp_path):
    """run_all: a command that fails fails the launch, with its error in its
    output, and a rank left waiting for a peer that will never join is
    stopped rather than holding the test for the rendezvous timeout."""
    waiting = command(tmp_path, tmp_path / "waits", ["--distributed-world-size", "2",
        "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}",
        "--distributed-no-spawn", "--distributed-backend", "gloo", "--distributed-rank", "1"])  # fmt: skip
    failing = command(tmp_path, tmp_path / "fails", ["--no-such-option"])
    with pytest.raises(AssertionError, match="unrecognized arguments: --no-such-option"):
        run_all([waiting, failing], tmp_path, timeout=60)
