"""Scaling out a transformers run changes nothing but speed: the same 8
sequences an update, fed as batch 8, as batch 4 with 2 accumulation steps,
or as 2 torchrun processes (gloo, CPU) of batch 4, give the same logged
loss, gradients and bias statistics; a checkpoint written by 2 processes
resumes on 1. The runs themselves: tests/hf_scale_worker.py."""

import json
import math
import os
import subprocess

import pytest
import torch

pytest.importorskip("transformers")

import hf_scale_worker as worker  # noqa: E402
from natbias_testing import REPO, free_port, script_python  # noqa: E402

from natbias.hf import UnigramLabelSmoothingLoss  # noqa: E402

RELATIVE = 1e-5


def test_the_loss_is_the_token_sum_over_the_update_when_the_trainer_counts_it():
    prior = torch.tensor([0.5, 0.3, 0.2])
    loss = UnigramLabelSmoothingLoss(prior.log(), epsilon=0.1)
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    labels = torch.tensor([[0, 2, -100]])
    log_p = torch.log_softmax(logits[0, :2], -1)
    # Per token (1 - eps)(-log p(y)) + eps * (-sum_v omega(v) log p(v)), by hand:
    per_token = [0.9 * -log_p[i, y] - 0.1 * (prior * log_p[i]).sum() for i, y in enumerate([0, 2])]
    total = per_token[0] + per_token[1]
    # Alone: the mean over its own two target tokens.
    assert loss({"logits": logits}, labels).item() == pytest.approx(total.item() / 2, rel=1e-6)
    # In an update of 5 target tokens (other micro-batches, other processes hold 3).
    for items in (5, torch.tensor(5)):
        given = loss({"logits": logits}, labels, num_items_in_batch=items)
        assert given.item() == pytest.approx(total.item() / 5, rel=1e-6)


def _losses(history):
    return [entry["loss"] for entry in history if "loss" in entry]


def _statistics(history):
    """Each update's bias statistics, unrounded (tests/hf_scale_worker.py)."""
    return [entry["unrounded"] for entry in history if "loss" in entry]


def _assert_same_statistics(ours: dict, theirs: dict) -> None:
    """Each statistic within RELATIVE of the other; a divergence (bias_kl, in
    bits) within RELATIVE of log2 |V| more: it is the difference of two
    cross-entropies of about that size, whose float rounding it keeps."""
    assert ours.keys() == theirs.keys() and ours
    for key, value in theirs.items():
        scale = abs(value) + (math.log2(worker.VOCAB) if "kl" in key else 0.0)
        assert abs(ours[key] - value) <= RELATIVE * scale, (key, ours[key], value)


def _close(a, b):
    return all(x == pytest.approx(y, rel=RELATIVE) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.mark.training
@pytest.mark.parametrize("natural_bias", [True, False], ids=["natural-bias", "stock"])
def test_accumulating_gradients_trains_the_model_one_batch_trains(tmp_path, natural_bias):
    whole, whole_grads = worker.train(tmp_path / "8x1", 8, 1, natural_bias=natural_bias)
    split, split_grads = worker.train(tmp_path / "4x2", 4, 2, natural_bias=natural_bias)
    assert len(_losses(whole)) == 4 and _close(_losses(whole), _losses(split))
    norms = [[entry["grad_norm"] for entry in h if "grad_norm" in entry] for h in (whole, split)]
    assert _close(*norms)
    for a, b in zip(whole_grads, split_grads, strict=True):
        assert ((a - b).norm() / a.norm()).item() < RELATIVE
    if natural_bias:
        assert len(_statistics(whole)) == 4
        for a, b in zip(_statistics(whole), _statistics(split), strict=True):
            _assert_same_statistics(a, b)


def _torchrun(out, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    command = [script_python(), "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    command += [str(REPO / "tests/hf_scale_worker.py"), "--out", str(out), *args]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout + run.stderr


@pytest.mark.training
def test_two_processes_train_as_one_with_accumulation_and_resume_on_one(tmp_path):
    printed = _torchrun(tmp_path / "2x4", "--batch", "4", "--save-steps", "2")
    two = json.loads((tmp_path / "2x4/history_rank0.json").read_text())
    one, one_grads = worker.train(tmp_path / "4x2", 4, 2)
    assert _close(_losses(two), _losses(one))
    for a, b in zip([e for e in two if "loss" in e], [e for e in one if "loss" in e], strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=RELATIVE)
        _assert_same_statistics(a["unrounded"], b["unrounded"])
        assert set(a["unrounded"]) <= set(a)  # and the rounded ones were logged
    for a, b in zip(torch.load(tmp_path / "2x4/gradients.pt"), one_grads, strict=True):
        assert ((a - b).norm() / a.norm()).item() < RELATIVE
    # The statistics are computed and printed once per log (4 updates), by rank 0 alone.
    assert printed.count("'bias_kl'") == 4
    rank1 = json.loads((tmp_path / "2x4/history_rank1.json").read_text())
    assert _close(_losses(rank1), _losses(two)) and not [e for e in rank1 if "bias_kl" in e]
    # Written by 2 processes after update 2, resumed on 1: updates 3 and 4 as uninterrupted.
    resumed, _ = worker.train(
        tmp_path / "resumed", 4, 2, resume=str(tmp_path / "2x4/trainer/checkpoint-2")
    )
    assert _losses(resumed)[-2:] and _close(_losses(resumed)[-2:], _losses(one)[-2:])
    for a, b in zip(_statistics(resumed)[-2:], _statistics(one)[-2:], strict=True):
        _assert_same_statistics(a, b)
