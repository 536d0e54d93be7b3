"""The criterion of App. A.4: KL(p || p_theta) - lambda KL(omega(p) || p_theta)
for the first N updates, then the standard objective.

Exact checks run in-process on the objects fairseq-train builds (tiny model,
no dropout); the switch, resuming and the log go through fairseq-train.
"""

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.data import Dictionary
from fairseq.logging import metrics
from natbias_testing import build_in_process, first_sentences, log_records, train

from fairseq_natbias.unigram_regularized_cross_entropy import (
    UnigramRegularizedCrossEntropyCriterion,
)
from natbias.errors import NaturalBiasError

REG = ["--criterion", "unigram_regularized_cross_entropy"]


def regularised(tmp_path, data, weight, updates, *extra, arch="transformer_natbias"):
    """Task, model (dropout 0) and criterion with lambda=weight, N=updates."""
    return build_in_process(
        data,
        tmp_path / "ckpt",
        *REG,
        "--unigram-reg-weight",
        weight,
        "--unigram-reg-updates",
        updates,
        "--dropout",
        "0",
        *extra,
        arch=arch,
    )


def standard(task):
    """fairseq's own label_smoothed_cross_entropy, epsilon 0.1 (the paper's)."""
    return LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)


def unigram_cross_entropy_term(model, sample, log_omega, pad):
    """sum over target tokens t of sum_v omega(v) log p_theta(v | y_<t), by
    hand: our own log-softmax of the model's logits, in float64."""
    logits = model(**sample["net_input"])[0].double()
    per_token = torch.log_softmax(logits, -1) @ log_omega.exp()
    return (per_token * sample["target"].ne(pad)).sum()


# --- the objective, in-process ------------------------------------------------


@pytest.mark.parametrize("arch", ["transformer_natbias", "transformer"])
def test_active_term_is_lambda_times_unigram_cross_entropy(
    tmp_path, toy_bin, toy_log_unigram, arch
):
    """loss - label_smoothed_cross_entropy = lambda sum_t sum_v omega(v) log p_theta(v|y_<t),
    i.e. -lambda KL(omega || p_theta) without its constant lambda H(omega)."""
    weight = 0.3
    task, model, criterion = regularised(tmp_path, toy_bin, weight, 5, arch=arch)
    sample = first_sentences(task)
    model.train()
    loss, _, log = criterion(model, sample)
    baseline, _, _ = standard(task)(model, sample)
    expected = weight * unigram_cross_entropy_term(
        model, sample, toy_log_unigram, task.target_dictionary.pad()
    )
    assert expected < 0
    assert (loss - baseline).item() == pytest.approx(expected.item(), rel=1e-5)
    assert log["unigram_reg"].item() == pytest.approx(expected.item(), rel=1e-5)
    assert log["loss"].item() == pytest.approx(loss.item())
    assert log["unigram_reg_tokens"].item() == sample["ntokens"]


def test_unreduced_loss_adds_the_term_token_by_token(tmp_path, toy_bin, toy_log_unigram):
    weight = 0.3
    task, model, criterion = regularised(tmp_path, toy_bin, weight, 5)
    sample = first_sentences(task, n=6)
    model.train()
    per_token, _ = criterion.compute_loss(model, model(**sample["net_input"]), sample, reduce=False)
    baseline, _ = standard(task).compute_loss(
        model, model(**sample["net_input"]), sample, reduce=False
    )
    logits = model(**sample["net_input"])[0].double()
    term = weight * (torch.log_softmax(logits, -1) @ toy_log_unigram.exp())
    term = term * sample["target"].ne(task.target_dictionary.pad())
    torch.testing.assert_close(
        (per_token - baseline).view(-1).double(), term.view(-1), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    "weight, updates, done, training",
    [
        (0.0, 5, 0, True),  # lambda = 0
        (0.3, 0, 0, True),  # N = 0
        (0.3, 5, 5, True),  # the N updates are done
        (0.3, 5, 0, False),  # validation reports the standard objective
    ],
    ids=["lambda0", "N0", "after-N", "validation"],
)
def test_equals_label_smoothed_cross_entropy_when_off(
    tmp_path, toy_bin, weight, updates, done, training
):
    task, model, criterion = regularised(tmp_path, toy_bin, weight, updates)
    criterion.set_num_updates(done)
    sample = first_sentences(task)
    model.train(training)
    loss, sample_size, log = criterion(model, sample)
    baseline, baseline_size, baseline_log = standard(task)(model, sample)
    assert torch.equal(loss, baseline) and sample_size == baseline_size
    assert torch.equal(log["nll_loss"], baseline_log["nll_loss"])
    assert ("unigram_reg" in log) == training  # training lines always carry it
    if training:
        assert log["unigram_reg"].item() == 0.0


def test_term_is_on_for_updates_1_to_N(tmp_path, toy_bin):
    """fairseq's update_num counts the updates done before this one."""
    task, model, criterion = regularised(tmp_path, toy_bin, 0.3, 3)
    model.train()
    on = []
    for done in range(5):
        criterion.set_num_updates(done)
        on.append(criterion.regularizing(model))
    assert on == [True, True, True, False, False]


def test_omega_is_the_models_bias_unigram(tmp_path, toy_bin, toy_log_unigram):
    """Same counter, same smoothing: omega is exactly the unigram behind the bias."""
    task, model, criterion = regularised(tmp_path, toy_bin, 0.3, 5, "--natbias-smoothing", "0.5")
    criterion.prepare(model)
    assert torch.equal(criterion._omega, model.target_log_unigram.exp())
    assert torch.equal(model.decoder.output_projection.bias.detach(), model.target_log_unigram)


# --- unbounded below: the clamp and its warning --------------------------------


def test_clamp_bounds_each_token_and_stops_its_gradient(tmp_path, toy_bin, monkeypatch, caplog):
    """With the bound below every token's unigram cross-entropy (which is at
    least H(omega) > 0), each token contributes exactly -lambda * B and the
    term adds no gradient."""
    weight, clamp = 0.3, 0.01
    task, model, criterion = regularised(tmp_path, toy_bin, weight, 5, "--unigram-reg-clamp", clamp)
    sample = first_sentences(task)
    model.train()
    loss, _, log = criterion(model, sample)
    bound = clamp * math.log(len(task.target_dictionary))
    assert log["unigram_clamped"].item() == sample["ntokens"]
    assert log["unigram_reg"].item() == pytest.approx(-weight * bound * sample["ntokens"], rel=1e-6)

    loss.backward()
    ours = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    standard(task)(model, sample)[0].backward()
    for mine, theirs in zip(ours, (p.grad for p in model.parameters())):
        torch.testing.assert_close(mine, theirs)

    monkeypatch.setattr(type(criterion), "_clamp_warned", False)
    with caplog.at_level(logging.WARNING), metrics.aggregate() as agg:
        type(criterion).reduce_metrics([log])
        type(criterion).reduce_metrics([log])
    assert caplog.text.count("reached the bound --unigram-reg-clamp") == 1
    assert agg.get_smoothed_value("unigram_clamped") == 1.0


# --- bad input ----------------------------------------------------------------


OPTIONS_FIX = "e.g. --unigram-reg-weight 0.1 --unigram-reg-updates"
CLAMP_FIX = "inf for no bound"


@pytest.mark.parametrize(
    "options, problem, fix",
    [
        ([], "--unigram-reg-weight is not set", OPTIONS_FIX),
        (["--unigram-reg-weight", "0.1"], "--unigram-reg-updates is not set", OPTIONS_FIX),
        (
            ["--unigram-reg-weight", "-0.1", "--unigram-reg-updates", "5"],
            "--unigram-reg-weight must be a finite number >= 0, got -0.1",
            OPTIONS_FIX,
        ),
        (
            ["--unigram-reg-weight", "nan", "--unigram-reg-updates", "5"],
            "--unigram-reg-weight must be a finite number >= 0, got nan",
            OPTIONS_FIX,
        ),
        (
            ["--unigram-reg-weight", "0.1", "--unigram-reg-updates", "-1"],
            "--unigram-reg-updates must be an integer >= 0, got -1",
            OPTIONS_FIX,
        ),
        (
            [
                "--unigram-reg-weight",
                "0.1",
                "--unigram-reg-updates",
                "5",
                "--unigram-reg-clamp",
                "0",
            ],
            "--unigram-reg-clamp must be > 0",
            CLAMP_FIX,
        ),
    ],
    ids=[
        "no-weight",
        "no-updates",
        "negative-weight",
        "nan-weight",
        "negative-updates",
        "zero-clamp",
    ],
)
def test_bad_options_are_refused_with_the_fix(tmp_path, toy_bin, options, problem, fix):
    with pytest.raises(ValueError) as error:
        build_in_process(toy_bin, tmp_path, *REG, *options)
    assert problem in str(error.value) and fix in str(error.value)


def test_missing_target_split_names_path_and_fix(tmp_path, toy_bin, fresh_copy):
    data = fresh_copy(toy_bin)
    task, model, criterion = build_in_process(
        data,
        tmp_path / "ckpt",
        *REG,
        "--unigram-reg-weight",
        "0.1",
        "--unigram-reg-updates",
        "5",
        arch="transformer",
    )  # a model without the natural bias: the criterion counts
    for path in data.glob("train.src-tgt.tgt.*"):
        path.unlink()
    with pytest.raises(NaturalBiasError) as error:  # one line from fairseq-train
        task.begin_epoch(1, model)  # where fairseq-train starts training
    text = str(error.value)
    assert f"{data}/train.src-tgt.tgt.bin" in text
    assert "fairseq-preprocess --trainpref" in text and "--unigram-reg-updates 0" in text


@pytest.mark.parametrize(
    "updates, training", [(0, True), (5, False)], ids=["N0-training", "validation-only"]
)
def test_no_training_data_needed_when_the_term_cannot_be_on(
    tmp_path, toy_bin, fresh_copy, updates, training
):
    """N = 0 never counts; nor does validation (fairseq-validate: no begin_epoch,
    the model in eval mode)."""
    data = fresh_copy(toy_bin)
    task, model, criterion = build_in_process(
        data,
        tmp_path / "ckpt",
        *REG,
        "--unigram-reg-weight",
        "0.1",
        "--unigram-reg-updates",
        updates,
    )
    for path in data.glob("train.src-tgt.tgt.*"):
        path.unlink()
    if training:
        task.begin_epoch(1, model)
    model.train(training)
    loss, _, _ = criterion(model, first_sentences(task, "valid"))
    assert torch.isfinite(loss) and criterion._omega is None


def test_a_task_that_is_neither_translation_nor_lm_is_refused(toy_bin):
    class ClassificationLikeTask:
        cfg = SimpleNamespace(data=str(toy_bin))  # no languages, no tokens_per_sample
        target_dictionary = Dictionary()

        def train_step(self, *args, **kwargs):
            pass

        valid_step = reduce_metrics = train_step  # a task's other methods the plugin wraps

        def begin_epoch(self, epoch, model):
            pass

    task = ClassificationLikeTask()
    UnigramRegularizedCrossEntropyCriterion(task, False, 0.1, 0.1, 5)
    with pytest.raises(
        NaturalBiasError, match="cannot tell which tokens .* --unigram-reg-updates 0"
    ):
        task.begin_epoch(1, None)


# --- end to end: fairseq-train, the switch at N and resuming across it ---------

WEIGHT, SWITCH = 0.5, 3


@pytest.fixture(scope="session")
def resumed_across_switch(tmp_path_factory, toy_bin):
    """N = 3: train 2 updates (N - 1) and save; resume to 4 (beyond N)."""
    save = tmp_path_factory.mktemp("resume_across_switch")
    options = [*REG, "--unigram-reg-weight", WEIGHT, "--unigram-reg-updates", SWITCH]
    first = train(toy_bin, save, *options, max_update=SWITCH - 1).stdout
    second = train(toy_bin, save, *options, max_update=SWITCH + 1).stdout
    return first, second


def by_update(stdout):
    return {int(r["num_updates"]): r for r in log_records(stdout, "train_inner")}


@pytest.mark.training
def test_switch_at_N_survives_resuming(resumed_across_switch):
    first, second = resumed_across_switch
    before, after = by_update(first), by_update(second)
    assert sorted(before) == [1, 2] and sorted(after) == [3, 4]  # really resumed at 2
    lines = {**before, **after}
    assert all(lines[u]["unigram_reg"] < 0 for u in (1, 2, 3))  # updates 1..N
    assert lines[4]["unigram_reg"] == 0.0
    for record in lines.values():
        assert "kl_unigram" in record and "bias_kl" in record  # the hook logs too


@pytest.mark.training
def test_logged_loss_is_standard_loss_plus_unigram_reg(resumed_across_switch, lsce_run):
    """Update 1 sees the same model and batch in both runs: the regularised run's
    loss - unigram_reg is label_smoothed_cross_entropy's loss (to print precision)."""
    ours, theirs = by_update(resumed_across_switch[0])[1], by_update(lsce_run)[1]
    assert ours["unigram_reg"] < -0.5  # lambda * CE(omega, p_theta) in bits, clearly on
    assert ours["loss"] - ours["unigram_reg"] == pytest.approx(theirs["loss"], abs=1.1e-3)
    assert ours["nll_loss"] == theirs["nll_loss"]


@pytest.mark.training
def test_validation_reports_the_standard_objective(resumed_across_switch):
    valid = log_records(resumed_across_switch[0], "valid")
    assert valid and all("unigram_reg" not in record for record in valid)


@pytest.mark.training
def test_stock_transformer_and_the_bound_in_the_log(tmp_path, toy_bin):
    """Any translation model; with a bound below every token's unigram
    cross-entropy, the warning is in the log from update 1 and each token
    contributes exactly -lambda * B (B = clamp * ln|V| nats)."""
    clamp = 0.01
    out = train(
        toy_bin,
        tmp_path,
        "--no-save",
        *REG,
        "--unigram-reg-weight",
        WEIGHT,
        "--unigram-reg-updates",
        1,
        "--unigram-reg-clamp",
        clamp,
        arch="transformer",
        max_update=2,
    ).stdout
    lines = by_update(out)
    vocab = len(Dictionary.load(str(toy_bin / "dict.tgt.txt")))
    assert lines[1]["unigram_reg"] == pytest.approx(-WEIGHT * clamp * math.log2(vocab), abs=5.1e-4)
    assert lines[1]["unigram_clamped"] == 1.0
    assert lines[2]["unigram_reg"] == 0.0 and lines[2]["unigram_clamped"] == 0.0
    warning = out.index("reached the bound --unigram-reg-clamp")
    assert warning < out.index("num_updates=1,")  # logged before update 1's line
    assert "kl_unigram" not in lines[1]  # the natbias hook belongs to transformer_natbias


@pytest.mark.training
def test_language_model_counts_its_next_token_targets(toy_lm_bin, tmp_path):
    """With --task language_modeling omega is the LM's target unigram (the
    model's own bias counts the same): no warning that they differ, and the
    term is logged."""
    from natbias_testing import train_lm

    result = train_lm(
        toy_lm_bin,
        tmp_path / "lm",
        *REG,
        "--label-smoothing",
        "0.1",
        "--unigram-reg-weight",
        "0.1",
        "--unigram-reg-updates",
        "2",
        "--no-save",
        max_update=2,
    )
    log = result.stdout + result.stderr
    records = log_records(log, "train_inner")
    assert [r["unigram_reg"] < 0 for r in records] == [True, True]
    assert "target unigram differs" not in log
