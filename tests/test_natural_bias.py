"""What the natbias models share (fairseq_natbias/natural_bias.py): the default
weight init (``gain``) at update 0 and after one update, the same initial
parameters whatever the bias, the gradient norm fairseq clips, and telling a
natbias checkpoint from others. Checkpoints (earlier versions', resuming,
fine-tuning): test_checkpoint_settings.py."""

import argparse
import math
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary

from fairseq_natbias.analysis import decomposition
from fairseq_natbias.checkpoint_loading import CheckpointError, read_checkpoint
from fairseq_natbias.cli.step0 import validation_divergence
from fairseq_natbias.natural_bias import check_natbias_checkpoint
from natbias_testing import first_sentences, log_records, train
from test_transformer_natbias import build, hand_log_unigram
from test_unigram import hand_counts


# --- the default weight init --------------------------------------------------------


ALL_TIED = ["--share-all-embeddings"]


@pytest.fixture(scope="module")
def unigram_cross_entropy(multi30k_bin, multi30k_text):
    """The training unigram's cross-entropy on the validation targets (bits),
    counted here once for the tests below, and the number of those targets."""
    dictionary = Dictionary.load(str(multi30k_bin / "dict.en.txt"))
    log_u = hand_log_unigram(multi30k_text / "train.en", dictionary)
    valid = hand_counts(multi30k_text / "valid.en", dictionary)
    return -(valid * log_u).sum() / valid.sum() / math.log(2), valid.sum()


# The default in every tying and pre-norm; ``damped`` (the other init that
# starts at the unigram, not the default) once, to keep the suite short.
@pytest.mark.parametrize("tying, weight_init", [
    ([], []),
    (["--share-decoder-input-output-embed"], []),
    (ALL_TIED, []),
    (ALL_TIED + ["--encoder-normalize-before", "--decoder-normalize-before"], []),
    (ALL_TIED, ["--natbias-weight-init", "damped"]),
], ids=["untied", "decoder-tied", "all-tied", "all-tied-pre-norm", "all-tied-damped"])
def test_default_starts_at_the_unigram(multi30k_bin, unigram_cross_entropy, tying, weight_init):
    """Fig. 1 at update 0 with the DEFAULT settings (and ``damped``), on real
    text: a fresh unigram model's validation NLL is the unigram's
    cross-entropy (within 0.3 bits), tied or untied."""
    unigram_ce_bits, valid_tokens = unigram_cross_entropy
    _, task, model = build(multi30k_bin, *tying, *weight_init)
    fresh = validation_divergence(task, model)
    assert fresh["tokens"] == valid_tokens
    assert abs(fresh["nll"] - unigram_ce_bits) < 0.3, fresh


def test_the_zero_bias_starts_far_from_the_unigram(multi30k_bin, unigram_cross_entropy):
    """The baseline the default is measured against: the same fresh network
    with b = 0 starts at about the uniform distribution's NLL, not the
    unigram's."""
    unigram_ce_bits, _ = unigram_cross_entropy
    _, task, zero = build(multi30k_bin, *ALL_TIED, "--natbias-init", "zero")
    zero_result = validation_divergence(task, zero)
    assert zero_result["nll"] > unigram_ce_bits + 3.0, zero_result


@pytest.mark.parametrize("weight_init", ["gain", "fairseq", "damped"])
def test_biases_share_every_initial_parameter_but_the_bias(toy_bin, weight_init):
    states = {init: build(toy_bin, "--natbias-init", init,
                          "--natbias-weight-init", weight_init)[2].state_dict()
              for init in ("unigram", "zero", "none")}
    bias_key = "decoder.output_projection.bias"
    assert bias_key not in states["none"]
    for init in ("unigram", "zero"):
        assert set(states[init]) - {bias_key} == set(states["none"])
        for key, value in states["none"].items():
            assert torch.equal(states[init][key], value), (init, key)


# capped, retired for new models in 0.6.1, cannot train from scratch; its
# steps are abs-capped's while C u > 0 (tests/test_output_projection.py) and a
# checkpoint that holds it resumes (tests/test_checkpoint_settings.py).
@pytest.mark.parametrize("form", ["abs-capped", "linear", "exp"])
def test_one_update_moves_the_gain_by_speed_times_lr(toy_bin, tmp_path, form):
    """Through the real fairseq-train and fairseq's Adam, constant lr: after
    update 1 the logged gain is 0.05 +- speed * lr (abs-capped, the default,
    and linear: the cap and 0 are far) or 0.05 * exp(+- speed * lr) (exp): Adam's first
    step on u is lr * sign of its gradient."""
    lr, speed = 1e-3, 30.0
    result = train(toy_bin, tmp_path / "ckpt", "--lr-scheduler", "fixed", "--lr", str(lr),
                   "--warmup-updates", "0",  # the fixed schedule: lr from update 1
                   *(["--natbias-gain-form", form] if form != "abs-capped" else []),
                   "--natbias-gain-speed", str(speed), "--no-save", max_update=1)
    gain = log_records(result.stdout + result.stderr, "train_inner")[0]["gain"]
    if form in ("abs-capped", "capped", "linear"):
        expected = (0.05 + speed * lr, 0.05 - speed * lr)
    else:
        expected = (0.05 * math.exp(speed * lr), 0.05 * math.exp(-speed * lr))
    assert gain in [pytest.approx(value, abs=1e-4) for value in expected]


PAPER_WARMUP = ["--lr-scheduler", "inverse_sqrt", "--lr", "5e-4", "--warmup-updates", "4000",
                "--warmup-init-lr", "1e-7"]


@pytest.mark.parametrize("schedule", ["lr", "peak"])
def test_the_gain_schedule_through_fairseq_train(toy_bin, tmp_path, schedule):
    """The paper's warm-up, exp gain at C = 100, one update: ``lr`` moves
    log g by C lr(0) = 1e-5 (invisible in the log's 4 digits), ``peak`` by
    C lr(0) m(0) = 0.04 (m(0) = 5e-4 / 1e-7 capped at the warm-up's 4,000
    updates): g = 0.05 exp(+-0.04) = 0.0520 or 0.0480."""
    result = train(toy_bin, tmp_path / "ckpt", *PAPER_WARMUP, "--natbias-gain-form", "exp",
                   "--natbias-gain-schedule", schedule, "--no-save", max_update=1)
    gain = log_records(result.stdout + result.stderr, "train_inner")[0]["gain"]
    if schedule == "lr":
        assert gain == pytest.approx(0.05, abs=1e-4)
    else:
        assert gain in [pytest.approx(0.05 * math.exp(step), abs=1e-4) for step in (0.04, -0.04)]


def test_the_peak_schedule_saves_loads_and_resumes_its_gain(toy_bin, tmp_path):
    """The anchors and m are saved with the model; fairseq's loader (and its
    fold on loading) gives back the saved g, z_a + C m (u - u_a) by hand; a
    run resumed at update 3 ends where a run straight to 6 does. (fairseq's
    resume is not bit-exact: with the default schedule too, u differs by ~2%
    of its displacement and fc1's weight by ~1e-6, so 5% is the bound.)"""
    options = [*PAPER_WARMUP, "--natbias-gain-form", "exp", "--natbias-gain-schedule", "peak"]
    train(toy_bin, tmp_path / "resumed", *options, max_update=3)
    path = tmp_path / "resumed" / "checkpoint_last.pt"
    saved = torch.load(path, map_location="cpu", weights_only=False)["model"]
    prefix = "decoder.output_projection."
    u, u_a, z_a, m = (saved[prefix + name].item() for name in
                      ("gain_param", "gain_param_anchor", "gain_exponent_anchor", "gain_speedup"))
    assert m == pytest.approx(5e-4 / (1e-7 + 2 * (5e-4 - 1e-7) / 4000))  # m(2): update 3's
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(toy_bin)})
    loaded = models[0].decoder.output_projection
    assert loaded.gain().item() == pytest.approx(math.exp(z_a + 100 * m * (u - u_a)), rel=1e-6)
    models[0].set_num_updates(3)  # what fairseq's trainer does on loading
    assert loaded.gain().item() == pytest.approx(math.exp(z_a + 100 * m * (u - u_a)), rel=1e-6)

    train(toy_bin, tmp_path / "resumed", *options, max_update=6)
    train(toy_bin, tmp_path / "straight", *options, max_update=6)
    ends = [torch.load(tmp_path / run / "checkpoint_last.pt", map_location="cpu",
                       weights_only=False)["model"][prefix + "gain_exponent_anchor"].item()
            - math.log(0.05) for run in ("straight", "resumed")]
    assert abs(ends[0]) > 0.1  # it moved at the peak schedule's speed (~0.04 per update)
    assert ends[1] == pytest.approx(ends[0], rel=0.05)


def test_grad_norm_is_the_networks_not_the_gains(multi30k_bin):
    """fairseq clips and logs the norm of all gradients together. A fresh
    default model on Multi30k (~3,000 tokens): the gain's true gradient alone
    is several times the norm of all others (it sums over tokens x features);
    what the optimiser sees, divided by C * d, moves the global norm by < 1%."""
    _, task, model = build(multi30k_bin, "--share-all-embeddings", "--dropout", "0")
    sample = first_sentences(task, n=200)
    loss, sample_size, _ = _criterion_loss(task, model, sample)
    loss.backward()
    grads = {name: p.grad / sample_size for name, p in model.named_parameters()
             if p.grad is not None}
    projection = model.decoder.output_projection
    seen = grads.pop("decoder.output_projection.gain_param").abs().item()
    true = seen * projection.speed * projection.in_features
    others = math.sqrt(sum(g.pow(2).sum().item() for g in grads.values()))
    assert true > 2 * others  # undivided, it would be most of grad_norm
    assert math.hypot(others, seen) < 1.01 * others  # divided: grad_norm is the network's


def _criterion_loss(task, model, sample):
    from fairseq.criterions.label_smoothed_cross_entropy import (
        LabelSmoothedCrossEntropyCriterion)
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False,
                                                   label_smoothing=0.1)
    return criterion(model, sample)


# --- telling a natbias checkpoint from others ----------------------------------------


FIXTURE = Path(__file__).parent / "fixtures/v0.1.0/checkpoint_last.pt"


def test_natbias_checkpoints_are_told_from_others(tmp_path):
    """On the v0.1.0 fixture checkpoint (a real transformer_natbias one) and
    on copies of it changed to another arch and to no configuration."""
    fixture_state = read_checkpoint(str(FIXTURE))
    arch, model_class = check_natbias_checkpoint(str(FIXTURE))
    assert (arch, model_class.__name__) == ("transformer_natbias", "TransformerNatbiasModel")
    stock_cfg = dict(fixture_state["cfg"])
    stock_cfg["model"] = argparse.Namespace(**dict(vars(stock_cfg["model"]), arch="transformer"))
    stock = str(tmp_path / "stock.pt")
    torch.save(dict(fixture_state, cfg=stock_cfg), stock)
    with pytest.raises(CheckpointError, match="--arch transformer, not a fairseq_natbias model"):
        check_natbias_checkpoint(stock)
    bare = str(tmp_path / "bare.pt")
    torch.save({"model": fixture_state["model"]}, bare)
    with pytest.raises(CheckpointError, match="holds no training configuration"):
        check_natbias_checkpoint(bare)
    # The analysis tools and the examples call it from decomposition too.
    assert decomposition.check_natbias_checkpoint is check_natbias_checkpoint
