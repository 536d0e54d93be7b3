"""What the natbias models share (fairseq_natbias/natural_bias.py): the default
weight init (``gain``) at update 0 and after one update, the same initial
parameters whatever the bias, the gradient norm fairseq clips, and telling a
natbias checkpoint from others. Checkpoints (earlier versions', resuming,
fine-tuning): test_checkpoints.py."""

import argparse
import math
from pathlib import Path

import decomposition
import pytest
import torch
from fairseq.data import Dictionary
from natbias_testing import first_sentences, log_records, train
from test_counts import hand_counts
from test_transformer_natbias import build, hand_log_unigram

from fairseq_natbias.checkpoint_loading import CheckpointError, read_checkpoint
from fairseq_natbias.cli.step0 import validation_divergence
from fairseq_natbias.natural_bias import check_natbias_checkpoint

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


# The default in every tying and pre-norm.
@pytest.mark.parametrize(
    "tying",
    [
        [],
        ["--share-decoder-input-output-embed"],
        ALL_TIED,
        ALL_TIED + ["--encoder-normalize-before", "--decoder-normalize-before"],
    ],
    ids=["untied", "decoder-tied", "all-tied", "all-tied-pre-norm"],
)
def test_default_starts_at_the_unigram(multi30k_bin, unigram_cross_entropy, tying):
    """Fig. 1 at update 0 with the DEFAULT settings, on real text: a fresh
    unigram model's validation NLL is the unigram's cross-entropy counted
    here from the text (within 0.05 bits; results.md reports 0.011), its KL
    from its prior below 0.03 bits, tied or untied."""
    unigram_ce_bits, valid_tokens = unigram_cross_entropy
    _, task, model = build(multi30k_bin, *tying)
    fresh = validation_divergence(task, model)
    assert fresh["tokens"] == valid_tokens
    assert abs(fresh["nll"] - unigram_ce_bits) < 0.05, (fresh, unigram_ce_bits)
    assert fresh["kl_unigram"] < 0.03, fresh


def test_the_zero_bias_starts_far_from_the_unigram(multi30k_bin, unigram_cross_entropy):
    """The baseline the default is measured against: the same fresh network
    with b = 0 starts at about the uniform distribution's NLL, not the
    unigram's."""
    unigram_ce_bits, _ = unigram_cross_entropy
    _, task, zero = build(multi30k_bin, *ALL_TIED, "--natbias-init", "zero")
    zero_result = validation_divergence(task, zero)
    assert zero_result["nll"] > unigram_ce_bits + 3.0, zero_result


@pytest.mark.parametrize(
    "options, counted, alpha",
    [(["--natbias-smoothing", "0.5"], "train", 0.5), (["--train-subset", "valid"], "valid", 1.0)],
    ids=["smoothing-0.5", "train-subset-valid"],
)
def test_a_counted_prior_follows_the_smoothing_and_the_train_subset(
    multi30k_bin, multi30k_text, options, counted, alpha
):
    """--natbias-smoothing != 1 and --train-subset, as fairseq-train builds
    the model: b is the add-alpha log-unigram of that subset's targets counted
    here (1e-5), and the fresh model's validation NLL is that unigram's
    cross-entropy within 0.05 bits, its KL from its prior below 0.03 bits."""
    dictionary = Dictionary.load(str(multi30k_bin / "dict.en.txt"))
    log_u = hand_log_unigram(multi30k_text / f"{counted}.en", dictionary, alpha)
    _, task, model = build(multi30k_bin, *options)
    bias = model.decoder.output_projection.bias.detach().double()
    assert (bias - torch.from_numpy(log_u)).abs().max().item() < 1e-5
    valid = hand_counts(multi30k_text / "valid.en", dictionary)
    cross_entropy = -(valid * log_u).sum() / valid.sum() / math.log(2)
    fresh = validation_divergence(task, model)
    assert abs(fresh["nll"] - cross_entropy) < 0.05, (fresh, cross_entropy)
    assert fresh["kl_unigram"] < 0.03, fresh


@pytest.mark.parametrize("weight_init", ["gain", "fairseq", "paper"])
def test_biases_share_every_initial_parameter_but_the_bias(toy_bin, weight_init):
    states = {
        init: build(toy_bin, "--natbias-init", init, "--natbias-weight-init", weight_init)[
            2
        ].state_dict()
        for init in ("unigram", "zero", "none")
    }
    bias_key = "decoder.output_projection.bias"
    assert bias_key not in states["none"]
    for init in ("unigram", "zero"):
        assert set(states[init]) - {bias_key} == set(states["none"])
        for key, value in states["none"].items():
            assert torch.equal(states[init][key], value), (init, key)


# The retired forms and schedule (capped, linear, exp; peak) cannot train from
# scratch: their steps are tested in tests/test_projection.py, and
# checkpoints that hold them load, resume and generate
# (tests/test_checkpoints.py).
@pytest.mark.training
def test_one_update_moves_the_gain_by_speed_times_lr(toy_bin, tmp_path):
    """Through the real fairseq-train and fairseq's Adam, constant lr: after
    update 1 the logged gain is 0.05 +- speed * lr (the cap and 0 are far):
    Adam's first step on u is lr * sign of its gradient."""
    lr, speed = 1e-3, 30.0
    result = train(
        toy_bin,
        tmp_path / "ckpt",
        "--lr-scheduler",
        "fixed",
        "--lr",
        str(lr),
        "--warmup-updates",
        "0",  # the fixed schedule: lr from update 1
        "--natbias-gain-speed",
        str(speed),
        "--no-save",
        max_update=1,
    )
    gain = log_records(result.stdout + result.stderr, "train_inner")[0]["gain"]
    assert gain in [
        pytest.approx(0.05 + speed * lr, abs=1e-4),
        pytest.approx(0.05 - speed * lr, abs=1e-4),
    ]


def test_grad_norm_is_the_networks_not_the_gains(multi30k_bin):
    """fairseq clips and logs the norm of all gradients together. A fresh
    default model on Multi30k (~3,000 tokens): the gain's true gradient alone
    is several times the norm of all others (it sums over tokens x features);
    what the optimiser sees, divided by C * d, moves the global norm by < 1%."""
    _, task, model = build(multi30k_bin, "--share-all-embeddings", "--dropout", "0")
    sample = first_sentences(task, n=200)
    loss, sample_size, _ = _criterion_loss(task, model, sample)
    loss.backward()
    grads = {
        name: p.grad / sample_size for name, p in model.named_parameters() if p.grad is not None
    }
    projection = model.decoder.output_projection
    seen = grads.pop("decoder.output_projection.gain_param").abs().item()
    true = seen * projection.gain_speed * projection.in_features
    others = math.sqrt(sum(g.pow(2).sum().item() for g in grads.values()))
    assert true > 2 * others  # undivided, it would be most of grad_norm
    assert math.hypot(others, seen) < 1.01 * others  # divided: grad_norm is the network's


def _criterion_loss(task, model, sample):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    return criterion(model, sample)


# --- telling a natbias checkpoint from others ----------------------------------------


FIXTURE = Path(__file__).parent / "fixtures/v1.0.0/checkpoint_last.pt"


def test_natbias_checkpoints_are_told_from_others(tmp_path):
    """On the v1.0.0 fixture checkpoint (a real transformer_natbias one) and
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
