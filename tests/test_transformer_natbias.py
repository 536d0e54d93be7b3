"""transformer_natbias end to end through the real fairseq CLIs, plus the
model's initial state checked against independent computations."""

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from natbias_testing import BIN, NO_LOADER_PROCESS, REPO, TINY_MODEL, TINY_TRAINING, fairseq, train
from test_counts import hand_counts

from fairseq_natbias.checkpoint_loading import read_checkpoint
from fairseq_natbias.cli import step0
from fairseq_natbias.cli.step0 import build_from_training_args
from fairseq_natbias.training_data import symbols
from natbias.counts import write_counts_file
from natbias.errors import NaturalBiasError


def hand_log_unigram(text_path, dictionary, alpha=1.0):
    counts = hand_counts(text_path, dictionary).astype(float)
    return np.log((counts + alpha) / (counts.sum() + alpha * len(dictionary)))


def build(data, *options):
    """The model fairseq-train would build, without training it."""
    argv = [
        str(data),
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        "transformer_natbias",
        *TINY_MODEL,
        "--cpu",
        "--seed",
        "1",
        "--save-dir",
        "/nonexistent/ckpt",
        *map(str, options),
    ]
    return build_from_training_args(argv)


def count_translated(result):
    """Hypotheses printed, checked against fairseq-generate's own summary.

    (fairseq 0.12 drops a last batch whose size is not a multiple of
    --required-batch-size-multiple, default 8: tests pass 1.)"""
    hypotheses = sum(line.startswith("H-") for line in result.stdout.splitlines())
    reported = re.search(r"Translated ([\d,]+) sentences", result.stderr)
    assert reported and int(reported.group(1).replace(",", "")) == hypotheses
    return hypotheses


def checkpoint_bias(path):
    state = torch.load(path, map_location="cpu")
    return state["model"].get("decoder.output_projection.bias")


@pytest.mark.parametrize("data_fixture", ["toy_bin", "toy_bin_joined"])
def test_initial_bias_is_log_unigram_of_target_side(request, toy_text, data_fixture):
    data = request.getfixturevalue(data_fixture)
    _, task, model = build(data)
    expected = hand_log_unigram(toy_text / "train.tgt", task.target_dictionary)
    bias = model.decoder.output_projection.bias.detach().double().numpy()
    np.testing.assert_allclose(bias, expected, atol=1e-5)
    assert np.isfinite(bias).all()
    assert model.decoder.output_projection.bias.requires_grad


def test_baselines_and_file_bias(toy_bin, toy_text, tmp_path):
    _, _, zero = build(toy_bin, "--natbias-init", "zero")
    assert torch.count_nonzero(zero.decoder.output_projection.bias) == 0
    _, _, none = build(toy_bin, "--natbias-init", "none")
    assert none.decoder.output_projection.bias is None

    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    counts = np.arange(len(dictionary)) % 5  # an "external corpus"
    counts_file = tmp_path / "external.counts"
    write_counts_file(str(counts_file), symbols(dictionary), counts)
    _, _, from_file = build(
        toy_bin,
        "--natbias-init",
        "file",
        "--natbias-counts",
        counts_file,
        "--natbias-smoothing",
        "0.5",
        "--natbias-freeze",
    )
    expected = np.log((counts + 0.5) / (counts.sum() + 0.5 * len(counts)))
    bias = from_file.decoder.output_projection.bias
    np.testing.assert_allclose(bias.detach().double().numpy(), expected, atol=1e-5)
    assert not bias.requires_grad


@pytest.mark.parametrize(
    "weight_init, added",
    [
        (None, {"decoder.output_projection.gain_param"}),  # the default: gain
        ("fairseq", set()),
    ],
)
def test_default_is_stock_fairseq_plus_a_bias_and_gain(toy_bin, weight_init, added):
    """The default weight init leaves every fairseq parameter as the stock
    transformer draws it (same seed): the model differs in the bias and the
    scalar gain alone (``fairseq``: in the bias alone)."""
    stock = build_from_training_args(
        [str(toy_bin), "--arch", "transformer", *TINY_MODEL, "--cpu", "--seed", "1"]
    )[2].state_dict()
    options = [] if weight_init is None else ["--natbias-weight-init", weight_init]
    natbias = build(toy_bin, *options)[2].state_dict()
    assert set(natbias) - set(stock) == {
        "decoder.output_projection.bias",
        "target_log_unigram",
        *added,
    }
    for key, value in stock.items():
        assert torch.equal(natbias[key], value), key
    assert torch.equal(natbias["decoder.output_projection.bias"], natbias["target_log_unigram"])


def test_weight_init_is_the_same_whatever_the_bias(toy_bin):
    weights = {}
    for init in ("unigram", "zero", "none"):
        _, _, model = build(toy_bin, "--natbias-init", init, "--natbias-weight-init", "paper")
        weights[init] = model.decoder.output_projection.weight.detach().clone()
        norm = model.target_log_unigram.norm()
        assert math.isclose(weights[init].norm().item(), norm.item(), rel_tol=1e-4)
    assert torch.equal(weights["unigram"], weights["zero"])
    assert torch.equal(weights["unigram"], weights["none"])


@pytest.mark.training
def test_zero_and_no_bias_train_and_generate(toy_bin, tmp_path):
    """The baselines through fairseq-train and fairseq-generate; the default
    (unigram) goes through both in the tests below and in most others."""
    for init in ("zero", "none"):
        save_dir = tmp_path / init
        train(toy_bin, save_dir, "--natbias-init", init, max_update=3)
        bias = checkpoint_bias(save_dir / "checkpoint_last.pt")
        assert (bias is None) == (init == "none")
        result = fairseq(
            "fairseq-generate",
            *NO_LOADER_PROCESS,
            toy_bin,
            "--user-dir",
            "fairseq_natbias",
            "--path",
            save_dir / "checkpoint_last.pt",
            "--beam",
            "5",
            "--cpu",
            "--max-len-b",
            "10",
            "--required-batch-size-multiple",
            "1",
        )
        assert count_translated(result) == 20


def adam_step_bound(lr, betas, step):
    """The largest change one update of fairseq's Adam (eps > 0 and no weight
    decay only shrink it) can make to a parameter at update ``step``:
    lr sqrt(1 - b2^t) / (1 - b1^t) |m_t| / sqrt(v_t), and by Cauchy-Schwarz
    over the gradients' weights, |m_t| / sqrt(v_t) <= (1 - b1) / sqrt(1 - b2)
    sqrt(sum_{k<t} (b1^2 / b2)^k) (Kingma and Ba, 2015, sec. 2.1, without
    their approximation)."""
    b1, b2 = betas
    ratio = b1**2 / b2
    moments = (1 - b1) / math.sqrt(1 - b2) * math.sqrt((1 - ratio**step) / (1 - ratio))
    return lr * math.sqrt(1 - b2**step) / (1 - b1**step) * moments


# A constant learning rate, from the first update (TINY_TRAINING warms up from 0).
CONSTANT_LR = ["--lr-scheduler", "fixed", "--warmup-updates", "0", "--lr", "5e-3"]


@pytest.mark.training
def test_resume_keeps_trained_bias_without_recounting(toy_bin, toy_log_unigram, tmp_path):
    """Five updates, then a resume for one: the resumed update moves b from
    the b it loaded by at most one Adam step, where b has moved from its
    start, the log-unigram, by more than two: a resume that put b back to
    the prior (or recounted it) fails. (fairseq's resume is not bit-exact
    against a run of six updates, which the test therefore does not use:
    0.0008 apart in b here, as much as three updates move it.)"""
    first = train(toy_bin, tmp_path, *CONSTANT_LR, max_update=5)
    assert "target unigram:" in first.stderr + first.stdout
    loaded = checkpoint_bias(tmp_path / "checkpoint_last.pt").double()
    second = train(toy_bin, tmp_path, *CONSTANT_LR, max_update=6)
    log = second.stderr + second.stdout
    assert "target unigram:" not in log  # nothing recounted
    assert "@ 5 updates" in log  # really resumed
    final = checkpoint_bias(tmp_path / "checkpoint_last.pt").double()
    # one update's bound, plus float32's rounding of the sum: an ulp of the largest |b|
    one_step = adam_step_bound(5e-3, (0.9, 0.997), step=6)
    one_step += float(np.spacing(np.float32(final.abs().max())))
    moved = (final - loaded).abs().max().item()
    assert 0 < moved <= one_step  # it kept training the loaded bias
    assert (loaded - toy_log_unigram).abs().max().item() > 2 * one_step


@pytest.mark.training
def test_generation_needs_no_training_split(toy_bin, fresh_copy, tmp_path):
    data = fresh_copy(toy_bin)
    train(data, tmp_path / "ckpt", max_update=2)
    for path in data.glob("train.*"):
        path.unlink()
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        data,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        tmp_path / "ckpt/checkpoint_last.pt",
        "--cpu",
        "--beam",
        "2",
        "--max-len-b",
        "5",
        "--required-batch-size-multiple",
        "1",
    )
    assert "target unigram:" not in result.stderr + result.stdout
    assert count_translated(result) == 20


@pytest.mark.training
def test_checkpoint_trained_with_eval_bleu_loads(toy_bin, tmp_path):
    """--eval-bleu leaves numpy arrays in the checkpoint's metrics state; torch's
    weights-only loading must still accept it (see checkpoint_loading.py)."""
    train(
        toy_bin,
        tmp_path / "ckpt",
        "--eval-bleu",
        "--eval-bleu-args",
        '{"max_len_b": 3}',
        "--best-checkpoint-metric",
        "bleu",
        "--maximize-best-checkpoint-metric",
        max_update=1,
    )
    state = read_checkpoint(str(tmp_path / "ckpt/checkpoint_last.pt"))
    assert "decoder.output_projection.bias" in state["model"]
    result = fairseq(
        "fairseq-generate",
        *NO_LOADER_PROCESS,
        toy_bin,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        tmp_path / "ckpt/checkpoint_last.pt",
        "--cpu",
        "--beam",
        "2",
        "--max-len-b",
        "3",
        "--required-batch-size-multiple",
        "1",
    )
    assert count_translated(result) == 20


@pytest.mark.training
def test_user_dir_works_from_another_directory(toy_bin, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    train(toy_bin, tmp_path / "ckpt", max_update=1, cwd=elsewhere)
    assert (tmp_path / "ckpt/checkpoint_last.pt").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        (["--adaptive-softmax-cutoff", "10,20"], "adaptive-softmax-cutoff"),
        (["--quant-noise-scalar", "0.1"], "--quant-noise-scalar"),
        (["--natbias-init", "file"], "needs --natbias-counts"),
        (["--natbias-smoothing", "-1"], "natbias-smoothing must be"),
        (["--natbias-init", "file", "--natbias-counts", "/no/such.counts"], "no such file"),
    ],
)
@pytest.mark.training
def test_bad_options_fail_with_a_clear_message(toy_bin, tmp_path, options, message):
    result = train(toy_bin, tmp_path / "ckpt", *options, check=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


NO_COUNTS = "--natbias-init file needs --natbias-counts PATH"


@pytest.mark.training
def test_fairseq_train_prints_the_error_in_one_line(toy_bin, tmp_path):
    """A real fairseq-train process: the plugin's error is one
    ``fairseq-train: error:`` line on stderr and exit status 1, no traceback."""
    argv = [toy_bin, "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias"]
    argv += [*TINY_MODEL, *TINY_TRAINING, "--save-dir", tmp_path, "--natbias-init", "file"]
    result = subprocess.run(
        [str(BIN / "fairseq-train"), *map(str, argv)],
        cwd=REPO,
        env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith(f"fairseq-train: error: {NO_COUNTS} (make one with")
    assert result.stderr.strip().endswith(line)


@pytest.mark.parametrize(
    "main_module, argv0, command",
    [
        ("fairseq_cli.train", "/usr/lib/python3/fairseq_cli/train.py", "fairseq-train"),
        ("fairseq_cli.generate", "-m", "fairseq-generate"),
        (None, "/venv/bin/fairseq-train", "fairseq-train"),
        (None, "/venv/bin/fairseq-interactive", "fairseq-interactive"),
        (None, "/venv/bin/natbias-step0", "natbias-step0"),
        (None, "ipykernel_launcher.py", None),
        ("pytest", "/venv/bin/pytest", None),
    ],
)
def test_the_plugin_knows_which_command_runs_it(monkeypatch, main_module, argv0, command):
    """``python -m fairseq_cli.train`` (the main module's spec), fairseq's console
    scripts and this package's (argv[0]) get the one-line errors; a notebook or
    pytest does not."""
    import types

    import fairseq_natbias

    main = types.ModuleType("__main__")
    main.__spec__ = types.SimpleNamespace(name=main_module) if main_module else None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [argv0])
    assert fairseq_natbias.running_command() == command


def test_a_library_user_catches_the_error(toy_bin):
    """Outside fairseq's command line (a notebook, the hub interface) the
    error reaches the caller."""
    with pytest.raises(NaturalBiasError, match=NO_COUNTS):
        build(toy_bin, "--natbias-init", "file")


def test_natbias_step0_prints_the_error_in_one_line(toy_bin):
    argv = [toy_bin, "--user-dir", "fairseq_natbias", "--arch", "transformer_natbias", "--cpu"]
    with pytest.raises(SystemExit, match=f"^natbias-step0: error: {NO_COUNTS}"):
        step0.main([*map(str, argv), "--natbias-init", "file"])


@pytest.mark.training
def test_missing_training_split_names_the_path(toy_bin, fresh_copy, tmp_path):
    data = fresh_copy(toy_bin)
    for path in data.glob("train.*"):
        path.unlink()
    result = train(data, tmp_path / "ckpt", check=False)
    assert result.returncode != 0
    assert "train.src-tgt.tgt" in result.stderr and "--natbias-init" in result.stderr


@pytest.mark.training
def test_counts_file_for_another_dictionary_is_refused(toy_bin, tmp_path):
    source_dictionary = Dictionary.load(str(toy_bin / "dict.src.txt"))
    counts_file = tmp_path / "src.counts"
    write_counts_file(
        str(counts_file), symbols(source_dictionary), np.ones(len(source_dictionary), dtype=int)
    )
    result = train(
        toy_bin,
        tmp_path / "ckpt",
        "--natbias-init",
        "file",
        "--natbias-counts",
        counts_file,
        check=False,
    )
    assert "does not match the vocabulary" in result.stderr
