"""The logging hook (App. A.6, Figs. 13 and 14; Fig. 1): bias_kl, bias_norm,
weight_norm, kl_unigram and kl_uniform, checked against computations made here.

In-process tests build what fairseq-train builds and compare the hook's sums
with a hand computation; end-to-end tests read fairseq-train's own log lines.
"""

import math
import os
import re
import subprocess
import weakref

import pytest
import torch
from fairseq.logging import metrics
from natbias_testing import (
    REPO,
    TINY_MODEL,
    TINY_TRAINING,
    build_in_process,
    command_of,
    first_sentences,
    free_port,
    log_records,
    train,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from natbias.statistics import Statistics

LN2 = math.log(2.0)
HOOK_KEYS = ("kl_unigram", "kl_uniform", "weight_norm", "bias_norm", "bias_kl")


class _Backward:
    """The one optimizer method task.train_step calls."""

    def backward(self, loss):
        loss.backward()


def hand_divergences(model, sample, log_omega, pad):
    """Sums over target tokens of KL(p_theta || unigram) and KL(p_theta ||
    uniform) in nats, from our own log-softmax of the logits, and the count."""
    with torch.no_grad():
        log_p = torch.log_softmax(model(**sample["net_input"])[0].double(), -1)
    p, mask = log_p.exp(), sample["target"].ne(pad)
    kl_unigram = (p * (log_p - log_omega)).sum(-1)
    kl_uniform = (p * (log_p + math.log(log_p.size(-1)))).sum(-1)
    return kl_unigram[mask].sum().item(), kl_uniform[mask].sum().item(), mask.sum().item()


def logged(task, criterion, logging_outputs):
    """What the hook (through the task's reduce_metrics) logs for these outputs."""
    with metrics.aggregate(new_root=True) as agg:
        task.reduce_metrics(logging_outputs, criterion)
    return agg.get_smoothed_values()


# --- in-process: the hook's numbers against hand computations -------------------


@pytest.mark.parametrize("step", ["valid", "train"])
def test_kl_sums_equal_hand_computation(tmp_path, toy_bin, toy_log_unigram, step):
    """Zero bias and fairseq's own W: the model is far from both references."""
    task, model, criterion = build_in_process(
        toy_bin,
        tmp_path,
        "--natbias-init",
        "zero",
        "--natbias-weight-init",
        "fairseq",
        "--dropout",
        "0",
    )
    sample = first_sentences(task)
    if step == "valid":
        _, _, out = task.valid_step(sample, model, criterion)
    else:
        _, _, out = task.train_step(sample, model, criterion, _Backward(), update_num=0)
    kl_unigram, kl_uniform, tokens = hand_divergences(
        model, sample, toy_log_unigram, task.target_dictionary.pad()
    )
    assert out["natbias_tokens"] == tokens == sample["ntokens"]
    # The hook works in float32: per token, terms of size ln|V| cancel.
    float32 = 1e-5 * tokens
    assert out["natbias_kl_unigram"] == pytest.approx(kl_unigram, rel=1e-5, abs=float32)
    assert out["natbias_kl_uniform"] == pytest.approx(kl_uniform, rel=1e-5, abs=float32)
    values = logged(task, criterion, [out])  # bits, rounded to 3 decimals
    assert values["kl_unigram"] == pytest.approx(kl_unigram / tokens / LN2, abs=5.1e-4)
    assert values["kl_uniform"] == pytest.approx(kl_uniform / tokens / LN2, abs=5.1e-4)
    assert values["kl_unigram"] > 0.5 and values["kl_uniform"] > 0.5


def test_kl_sums_weight_every_token_once_across_micro_batches(tmp_path, toy_bin, toy_log_unigram):
    """Two logging outputs (micro-batches or workers) give the token-weighted
    mean over both, not the mean of the two means."""
    task, model, criterion = build_in_process(
        toy_bin, tmp_path, "--natbias-init", "zero", "--dropout", "0"
    )
    pad = task.target_dictionary.pad()
    outs, hand = [], []
    for sample in (first_sentences(task, n=2), first_sentences(task, n=30)):
        outs.append(task.valid_step(sample, model, criterion)[2])
        hand.append(hand_divergences(model, sample, toy_log_unigram, pad))
        with torch.no_grad():  # the second batch meets a model near the unigram
            model.decoder.output_projection.bias.copy_(model.target_log_unigram)
    pooled = sum(h[0] for h in hand) / sum(h[2] for h in hand) / LN2
    means = [h[0] / h[2] / LN2 for h in hand]
    assert abs(sum(means) / 2 - pooled) > 0.1  # the two readings differ here
    assert logged(task, criterion, outs)["kl_unigram"] == pytest.approx(pooled, abs=5.1e-4)


@pytest.mark.parametrize("step", ["valid", "train"])
def test_kl_sums_in_chunks_equal_the_hand_computation(tmp_path, toy_bin, toy_log_unigram, step):
    """Chunks of 3 tokens (ragged last chunk, padding inside chunks) give the
    sums of one pass and of the hand computation."""
    task, model, criterion = build_in_process(
        toy_bin,
        tmp_path,
        "--natbias-init",
        "zero",
        "--natbias-weight-init",
        "fairseq",
        "--dropout",
        "0",
    )
    sample = first_sentences(task, n=7)
    results = []
    for chunk_tokens in (None, 3):
        if chunk_tokens:
            model.natbias_hook.chunk_elements = chunk_tokens * len(task.target_dictionary)
        if step == "valid":
            results.append(task.valid_step(sample, model, criterion)[2])
        else:
            results.append(task.train_step(sample, model, criterion, _Backward(), 0)[2])
    kl_unigram, kl_uniform, tokens = hand_divergences(
        model, sample, toy_log_unigram, task.target_dictionary.pad()
    )
    one_pass, chunked = results
    assert chunked["natbias_tokens"] == one_pass["natbias_tokens"] == tokens
    for key, hand in (("natbias_kl_unigram", kl_unigram), ("natbias_kl_uniform", kl_uniform)):
        assert chunked[key].item() == pytest.approx(one_pass[key].item(), rel=1e-6)
        assert chunked[key].item() == pytest.approx(hand, rel=1e-5, abs=1e-5 * tokens)


class _LiveBytes(TorchDispatchMode):
    """Peak bytes held by the tensors that the code run under it allocates:
    an op's output whose storage is none of its inputs' (a view's is) is
    new memory, freed when the tensor is."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for tensor in tree_leaves(out):
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.untyped_storage().data_ptr() not in inputs
            ):
                size = tensor.untyped_storage().nbytes()
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._free, size)
        return out

    def _free(self, size):
        self.live -= size


def test_statistics_memory_is_bounded_by_the_chunk(tmp_path, toy_bin):
    """The per-token statistics of 4,096 tokens over an 8,000-entry vocabulary
    (fp16 log-probabilities, as under --fp16): one pass would hold two
    float32 (tokens x |V|) tensors, 262 MB; in chunks of 2^16 entries the
    peak is three float32 chunks (786 kB), measured allocation by allocation."""
    _, model, _ = build_in_process(toy_bin, tmp_path)
    hook = model.natbias_hook
    vocab, tokens = 8000, 4096
    model.target_log_unigram = torch.log_softmax(torch.randn(vocab), -1)
    lprobs = torch.log_softmax(torch.randn(tokens, vocab), -1).half()
    mask = torch.ones(tokens, dtype=torch.bool)
    peaks = {}
    for chunk_elements in (tokens * vocab, 1 << 16):
        hook.chunk_elements = chunk_elements
        stats = Statistics(hook.chunk_elements)
        with torch.no_grad(), _LiveBytes() as tracker:
            stats.add(lprobs, mask, hook.model.target_log_unigram)
        peaks[chunk_elements] = (tracker.peak, [s.item() for s in stats.sums.values()])
    one_pass, chunked = peaks[tokens * vocab], peaks[1 << 16]
    assert one_pass[0] >= 2 * tokens * vocab * 4
    rows = (1 << 16) // vocab
    assert chunked[0] <= 3 * rows * vocab * 4 + 64 * 1024  # + small per-row vectors
    assert chunked[1] == pytest.approx(one_pass[1], rel=1e-5)


def test_stats_only_on_every_interval_th_update(tmp_path, toy_bin):
    task, model, criterion = build_in_process(
        toy_bin, tmp_path, "--natbias-stats-interval", "2", "--dropout", "0"
    )
    sample = first_sentences(task, n=4)
    tokens = [
        task.train_step(sample, model, criterion, _Backward(), update_num=u)[2]["natbias_tokens"]
        for u in range(4)
    ]
    assert tokens == [0, sample["ntokens"], 0, sample["ntokens"]]  # updates 2 and 4


@pytest.mark.parametrize("init", ["unigram", "zero"])
def test_bias_statistics_equal_hand_computation(tmp_path, toy_bin, toy_log_unigram, init):
    """bias_kl = KL(softmax(b) || unigram) in bits: 0 for the unigram bias,
    KL(uniform || unigram) for b = 0; bias_norm = ||b||; gain = g, the
    documented starting value 0.05; weight_norm = ||g W||_F."""
    task, model, criterion = build_in_process(toy_bin, tmp_path, "--natbias-init", init)
    stats = model.natbias_hook.bias_statistics()
    log_omega = toy_log_unigram
    if init == "unigram":
        expected_kl, expected_norm = 0.0, log_omega.norm().item()
    else:
        uniform = torch.full_like(log_omega, -math.log(len(log_omega)))
        expected_kl = (uniform.exp() * (uniform - log_omega)).sum().item() / LN2
        expected_norm = 0.0
        assert expected_kl > 0.5
    assert stats["bias_kl"] == pytest.approx(expected_kl, abs=1e-6)
    assert stats["bias_norm"] == pytest.approx(expected_norm, rel=1e-6)
    weight = model.decoder.output_projection.weight.detach().double()
    assert stats["gain"] == pytest.approx(0.05, rel=1e-6)
    assert stats["weight_norm"] == pytest.approx(0.05 * weight.pow(2).sum().sqrt().item(), rel=1e-6)


def test_bias_kl_never_prints_minus_zero(tmp_path, toy_bin):
    """softmax(log omega + c) = omega, but the float KL can come out just below
    0, which fairseq printed as "-0"."""
    task, model, criterion = build_in_process(toy_bin, tmp_path)
    bias = model.decoder.output_projection.bias
    log_omega = model.target_log_unigram

    def kl(log_p, log_q):  # KL(p || q), nats, computed as the statistics do
        return (log_p.exp() * (log_p - log_q)).sum(-1)

    shifts = [
        c
        for c in torch.linspace(-5, 5, 41)
        if kl((log_omega + c).log_softmax(-1), log_omega).item() < 0
    ]
    assert shifts  # float error does produce negative KLs here
    for c in shifts:
        with torch.no_grad():
            bias.copy_(log_omega + c)
        assert model.natbias_hook.bias_statistics()["bias_kl"] == 0.0
        model.natbias_hook._log_bias_now = True
        with metrics.aggregate(new_root=True) as agg:
            model.natbias_hook.log([])
        assert not str(agg.get_smoothed_value("bias_kl")).startswith("-")


def test_a_second_model_built_on_the_task_is_the_one_measured(tmp_path, toy_bin):
    """fairseq-train builds one model per task; a second build (tools, tests)
    must not leave the task measuring the first model, nor leave the second
    unmeasured."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    task, first, criterion = build_in_process(toy_bin, tmp_path, "--dropout", "0")
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        [
            str(toy_bin),
            "--user-dir",
            str(REPO / "fairseq_natbias"),
            "--arch",
            "transformer_natbias",
            *TINY_MODEL,
            *TINY_TRAINING,
            "--save-dir",
            str(tmp_path),
            "--natbias-init",
            "zero",
        ],
    )
    second = task.build_model(convert_namespace_to_omegaconf(args).model)
    sample = first_sentences(task, n=4)
    _, _, out = task.valid_step(sample, second, criterion)
    assert out["natbias_tokens"] == sample["ntokens"]
    assert logged(task, criterion, [out])["bias_kl"] > 0.5  # the zero bias, not the first (0)


# --- end to end: fairseq-train's log lines -------------------------------------


def lines(stdout, tag="train_inner"):
    return log_records(stdout, tag)


@pytest.mark.training
def test_fresh_unigram_model_logs_zero_bias_kl_and_its_norm(lsce_run, toy_log_unigram):
    """First line: the fresh model (fairseq's inverse_sqrt warm-up starts at
    lr 0, so update 1 leaves the parameters as initialised)."""
    first = lines(lsce_run)[0]
    assert first["bias_kl"] == 0.0
    assert first["bias_norm"] == pytest.approx(toy_log_unigram.norm().item(), abs=5.1e-5)
    assert all(record["bias_kl"] < 5e-5 for record in lines(lsce_run) + lines(lsce_run, "valid"))


@pytest.mark.training
def test_stock_label_smoothed_cross_entropy_gets_all_keys(lsce_run):
    for tag in ("train_inner", "train", "valid"):
        for record in lines(lsce_run, tag):
            assert set(HOOK_KEYS) <= set(record), tag


@pytest.mark.parametrize("step", ["valid", "train"])
def test_none_bias_logs_kl_but_no_bias_statistics(tmp_path, toy_bin, step):
    task, model, criterion = build_in_process(toy_bin, tmp_path, "--natbias-init", "none")
    assert model.decoder.output_projection.bias is None
    values = logged(task, criterion, [_one_step(task, model, criterion, step)])
    assert {"kl_unigram", "kl_uniform", "weight_norm"} <= set(values)
    assert "bias_kl" not in values and "bias_norm" not in values


@pytest.mark.parametrize("step", ["valid", "train"])
def test_no_natbias_logging_switches_the_hook_off(tmp_path, toy_bin, step):
    task, model, criterion = build_in_process(toy_bin, tmp_path, "--no-natbias-logging")
    out = _one_step(task, model, criterion, step)
    values = logged(task, criterion, [out])
    assert "loss" in values and not set(HOOK_KEYS) & set(values)
    assert not any(key.startswith("natbias_") for key in out)


def _one_step(task, model, criterion, step):
    sample = first_sentences(task, n=4)
    if step == "valid":
        return task.valid_step(sample, model, criterion)[2]
    return task.train_step(sample, model, criterion, _Backward(), update_num=0)[2]


# --- same numbers however an update is split: --update-freq and 2 workers -------
#
# Halving --max-tokens for --update-freq 2 gives other batches (batching by
# tokens packs differently), so nothing per update need be equal. Here the
# sentences of each update are the same: fixed --batch-size (10 or 20), no
# shuffling in epoch 1 (--curriculum 1), no dropout. fairseq splits the
# batches 0,1 | 2,3 | ... of one update into micro-batches (--update-freq 2)
# or workers (rank r takes batches r, r+2, ...), so the trajectories agree and
# every logged number of each update must too (timings aside). The run uses
# unigram_regularized_cross_entropy, whose term switches off after update 2,
# and a zero bias, so bias_kl moves.

SAME_UPDATES = [
    "--natbias-init",
    "zero",
    "--lr",
    "0.01",
    "--dropout",
    "0",
    "--curriculum",
    "1",
    "--required-batch-size-multiple",
    "1",
    "--max-tokens",
    "100000",
    "--criterion",
    "unigram_regularized_cross_entropy",
    "--unigram-reg-weight",
    "0.5",
    "--unigram-reg-updates",
    "2",
]
NOT_COMPARED = {"wps", "ups", "wall", "train_wall", "ppl"}  # timing; ppl = 2^nll_loss
PRINTED = 1.1e-3  # one unit in the third decimal, the coarsest rounding logged


def _two_workers(data, save_dir, batch_size):
    """One fairseq-train process per rank, rendezvous over TCP (gloo, CPU)."""
    port = free_port()
    command = [
        *command_of("fairseq-train"),
        data,
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        "transformer_natbias",
        *TINY_MODEL,
        *TINY_TRAINING,
        *SAME_UPDATES,
        "--batch-size",
        batch_size,
        "--max-update",
        "4",
        "--no-save",
        "--distributed-world-size",
        "2",
        "--distributed-init-method",
        f"tcp://127.0.0.1:{port}",
        "--distributed-no-spawn",
        "--distributed-backend",
        "gloo",
        "--ddp-backend",
        "legacy_ddp",
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen(
            [
                *map(str, command),
                "--distributed-rank",
                str(rank),
                "--save-dir",
                str(save_dir / f"rank{rank}"),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [rank.communicate(timeout=300) for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    for rank, (out, err) in zip(ranks, outputs):
        assert rank.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    return [out for out, _ in outputs]


@pytest.fixture(scope="session")
def same_updates_runs(tmp_path_factory, toy_bin):
    root = tmp_path_factory.mktemp("same_updates")
    whole = train(toy_bin, root / "whole", "--no-save", *SAME_UPDATES, "--batch-size", 20)
    halves = train(
        toy_bin, root / "halves", "--no-save", *SAME_UPDATES, "--batch-size", 10, "--update-freq", 2
    )
    workers = _two_workers(toy_bin, root / "workers", 10)
    return {"whole": whole.stdout, "update_freq_2": halves.stdout, "ranks": workers}


def assert_same_lines(ours, theirs, tag, skip=()):
    ours, theirs = lines(ours, tag), lines(theirs, tag)
    assert ours and len(ours) == len(theirs), tag
    for mine, other in zip(ours, theirs):
        keys = set(mine) - NOT_COMPARED - set(skip)
        assert keys == set(other) - NOT_COMPARED - set(skip), tag
        for key in sorted(keys):
            assert mine[key] == pytest.approx(other[key], abs=PRINTED), (tag, key)


@pytest.mark.training
def test_update_freq_2_logs_what_update_freq_1_logs(same_updates_runs):
    runs = same_updates_runs
    assert [r["bsz"] for r in lines(runs["update_freq_2"])] == [20.0] * 4
    assert_same_lines(runs["update_freq_2"], runs["whole"], "train_inner")
    # Validation batches differ (--batch-size-valid follows --batch-size): the
    # per-step wpb/bsz differ, the token-weighted means must not.
    assert_same_lines(runs["update_freq_2"], runs["whole"], "valid", skip={"wpb", "bsz"})
    first, last = lines(runs["whole"])[0], lines(runs["whole"])[-1]
    assert first["unigram_reg"] < 0 and last["unigram_reg"] == 0.0
    assert last["bias_kl"] < first["bias_kl"] - 2e-3  # the bias moved


@pytest.mark.training
def test_two_workers_log_what_one_process_logs(same_updates_runs):
    rank0, rank1 = same_updates_runs["ranks"]
    assert "distributed init (rank 0)" in rank0 and "as rank 1" in rank1
    assert "training on 2 devices" in rank0
    # Each rank's batch holds 10 sentences; 20 per update means the logging
    # outputs of both workers were summed (two independent trainings log 10).
    assert [r["bsz"] for r in lines(rank0)] == [20.0] * 4
    assert_same_lines(rank0, same_updates_runs["update_freq_2"], "train_inner")
    assert_same_lines(rank0, same_updates_runs["update_freq_2"], "valid", skip={"wpb", "bsz"})


@pytest.mark.training
def test_hook_logs_next_to_unigram_regularized_cross_entropy(same_updates_runs):
    for tag in ("train_inner", "train", "valid"):
        records = lines(same_updates_runs["whole"], tag)
        assert records and all(set(HOOK_KEYS) <= set(r) for r in records), tag
    assert all("unigram_reg" in r for r in lines(same_updates_runs["whole"]))


@pytest.mark.training
def test_fresh_zero_bias_logs_kl_of_uniform_to_unigram(same_updates_runs, toy_log_unigram):
    uniform = torch.full_like(toy_log_unigram, -math.log(len(toy_log_unigram)))
    expected = (uniform.exp() * (uniform - toy_log_unigram)).sum().item() / LN2
    first = lines(same_updates_runs["whole"])[0]
    assert first["bias_norm"] == 0.0  # update 1 ran at lr 0: the fresh model
    assert first["bias_kl"] == pytest.approx(expected, abs=5.1e-5) and expected > 0.5


@pytest.mark.training
def test_an_epoch_without_statistics_prints_none_of_them(tmp_path, toy_bin):
    """The toy corpus is 2 updates an epoch: with statistics every 4th update
    the second epoch has them (update 4) and the third (5, 6) has none. Its
    summary leaves them out instead of printing ``kl_unigram None``."""
    result = train(
        toy_bin, tmp_path / "ckpt", "--natbias-stats-interval", "4", "--no-save", max_update=6
    )
    log = result.stdout + result.stderr
    epochs = {int(m[1]): m[0] for m in re.finditer(r"\| train \| epoch (\d+) \|.*", log)}
    assert sorted(epochs) == [1, 2, 3]
    logged = [line for line in log.splitlines() if "| train |" in line or "| train_inner |" in line]
    assert logged and not [line for line in logged if "None" in line]
    assert "kl_unigram" in epochs[2] and "bias_kl" in epochs[2]
    assert "kl_unigram" not in epochs[3] and "bias_kl" not in epochs[3]
