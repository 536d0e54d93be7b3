"""Label smoothing towards the target unigram:
(1 - eps) (-log p(y)) + eps CE(omega, p) per target token.

The loss is checked against a hand-worked example and against our own
computation on the objects fairseq-train builds; the claim that the natural
bias is this objective's context-free optimum is checked on its gradient;
training goes through the real fairseq-train (translation and LM).
"""

import math

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from natbias_testing import build_in_process, first_sentences, log_records, train, train_lm

from natbias.errors import NaturalBiasError

ULS = ["--criterion", "unigram_label_smoothed_cross_entropy"]


def built(tmp_path, data, *extra, arch="transformer_natbias"):
    return build_in_process(data, tmp_path / "ckpt", *ULS, "--dropout", "0", *extra, arch=arch)


class FixedProbabilities:
    """A model stand-in whose log-probabilities are given: what
    ``get_lprobs_and_target`` asks of a model."""

    def __init__(self, probs, target):
        self.lprobs, self.target = torch.tensor(probs).log(), torch.tensor(target)

    def get_normalized_probs(self, net_output, log_probs):
        return self.lprobs

    def get_targets(self, sample, net_output):
        return self.target


def with_omega(criterion, omega):
    """The criterion with omega given instead of counted."""
    criterion._prior = {torch.device("cpu"): torch.tensor(omega)}
    return criterion


def test_hand_worked_loss(tmp_path, toy_bin):
    """Two target tokens, four entries of which id 1 is padding (probability
    ~0 in p and omega), eps = 0.1, omega = (0.5, 0, 0.3, 0.2):
      token y = 0, p = (0.5, 0, 0.25, 0.25):
        NLL = ln 2 = 0.693147; CE(omega, p) = 0.5 ln 2 + 0.3 ln 4 + 0.2 ln 4
            = 0.346574 + 0.415888 + 0.277259 = 1.039721
        loss = 0.9 * 0.693147 + 0.1 * 1.039721 = 0.727805
      token y = pad: 0, 0."""
    _, _, criterion = built(tmp_path, toy_bin, "--label-smoothing", "0.1")
    assert criterion.padding_idx == 1
    with_omega(criterion, [0.5, 1e-30, 0.3, 0.2])
    model = FixedProbabilities([[0.5, 1e-30, 0.25, 0.25], [0.25, 1e-30, 0.5, 0.25]], [0, 1])
    loss, nll = criterion.compute_loss(model, None, None, reduce=False)
    assert nll.tolist() == pytest.approx([0.693147, 0.0], abs=1e-6)
    assert loss.tolist() == pytest.approx([0.727805, 0.0], abs=1e-6)
    summed, summed_nll = criterion.compute_loss(model, None, None)
    assert summed.item() == pytest.approx(0.727805, abs=1e-6)
    assert summed_nll.item() == pytest.approx(0.693147, abs=1e-6)


@pytest.mark.parametrize("arch", ["transformer_natbias", "transformer"])
def test_loss_is_our_own_computation_on_a_real_batch(tmp_path, toy_bin, toy_log_unigram, arch):
    """On fairseq's objects: loss = (1 - eps) NLL + eps sum_t CE(omega, p_t),
    with omega counted in the tests and log p from our own float64
    log-softmax of the model's logits."""
    eps = 0.2
    task, model, criterion = built(tmp_path, toy_bin, "--label-smoothing", eps, arch=arch)
    sample = first_sentences(task)
    model.eval()
    loss, sample_size, log = criterion(model, sample)
    lprobs = torch.log_softmax(model(**sample["net_input"])[0].double(), -1)
    keep = sample["target"].ne(task.target_dictionary.pad())
    nll = -(lprobs.gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1) * keep).sum()
    unigram_ce = -((lprobs @ toy_log_unigram.exp()) * keep).sum()
    assert loss.item() == pytest.approx(((1 - eps) * nll + eps * unigram_ce).item(), rel=1e-5)
    assert log["nll_loss"].item() == pytest.approx(nll.item(), rel=1e-5)
    assert sample_size == keep.sum().item()


def test_eps_zero_is_fairseqs_cross_entropy_and_counts_nothing(tmp_path, toy_bin, fresh_copy):
    data = fresh_copy(toy_bin)
    task, model, criterion = built(tmp_path, data, "--label-smoothing", "0")
    for path in data.glob("train.src-tgt.tgt.*"):
        path.unlink()  # nothing to count from, and nothing is counted
    sample = first_sentences(task, "valid")
    model.eval()
    ours = criterion(model, sample)
    stock = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.0)(
        model, sample
    )
    assert ours[0].item() == pytest.approx(stock[0].item(), rel=1e-6)
    assert ours[2]["nll_loss"].item() == pytest.approx(stock[2]["nll_loss"].item(), rel=1e-6)
    assert not criterion._prior  # omega was never taken


def context_free_gradient(criterion, counts, eps_probs):
    """d loss / d b for a model that predicts softmax(b) at every position,
    over a corpus with these target ``counts``, at b = log ``eps_probs``."""
    targets = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    bias = torch.tensor(eps_probs, dtype=torch.float64).log().requires_grad_()

    class ContextFree:
        def get_normalized_probs(self, net_output, log_probs):
            return torch.log_softmax(bias, -1).expand(len(targets), -1)

        def get_targets(self, sample, net_output):
            return targets

    loss, _ = criterion.compute_loss(ContextFree(), None, None)
    loss.backward()
    return bias.grad


def test_the_natural_bias_is_the_context_free_optimum(tmp_path, toy_bin):
    """Targets counted (4, 0, 3, 1) (id 1, padding, never a target), omega
    their frequencies: the gradient of the summed loss with respect to a
    context-free model's logits is T p - (1 - eps) c - eps T omega, zero at
    p = omega. Under fairseq's uniform smoothing it is not zero there."""
    counts = [4, 0, 3, 1]
    omega = [c / 8 for c in counts]
    omega[1] = 1e-12  # p(pad) is never a target's
    _, _, criterion = built(tmp_path, toy_bin, "--label-smoothing", "0.1")
    criterion.padding_idx = -100  # this corpus has no padding
    with_omega(criterion, omega)
    ours = context_free_gradient(criterion, counts, omega)
    assert ours.abs().max().item() < 1e-5
    uniform = LabelSmoothedCrossEntropyCriterion(None, False, 0.1)
    uniform.padding_idx, uniform.ignore_prefix_size, uniform.sentence_avg = -100, 0, False
    assert context_free_gradient(uniform, counts, omega).abs().max().item() > 0.1


def test_omega_is_the_models_prior_or_the_counted_unigram(tmp_path, toy_bin, toy_log_unigram):
    """A natural-bias model's criterion smooths towards the model's own prior
    (so the one option, --natbias-smoothing, sets both); a stock model's
    counts the training targets with add-one smoothing."""
    for alpha in ("1", "0.5"):
        task, model, criterion = built(tmp_path / alpha, toy_bin, "--natbias-smoothing", alpha)
        model.eval()
        criterion(model, first_sentences(task, "valid"))
        assert torch.equal(criterion._prior[torch.device("cpu")], model.target_log_unigram.exp())
    assert not torch.allclose(model.target_log_unigram.double(), toy_log_unigram, atol=1e-3)
    task, model, criterion = built(tmp_path / "stock", toy_bin, arch="transformer")
    model.eval()
    criterion(model, first_sentences(task, "valid"))
    torch.testing.assert_close(
        criterion._prior[torch.device("cpu")].double().log(), toy_log_unigram, atol=1e-6, rtol=0
    )


@pytest.mark.parametrize(
    "options, problem",
    [(["--label-smoothing", "1"], "--label-smoothing must be in [0, 1), got 1.0")],
)
def test_bad_options_are_refused_with_the_fix(tmp_path, toy_bin, options, problem):
    with pytest.raises(ValueError) as error:
        built(tmp_path, toy_bin, *options)
    assert problem in str(error.value)


def test_missing_training_split_names_path_and_fix(tmp_path, toy_bin, fresh_copy):
    """A model without the natural bias leaves the criterion to count."""
    data = fresh_copy(toy_bin)
    task, model, criterion = built(tmp_path, data, arch="transformer")
    for path in data.glob("train.src-tgt.tgt.*"):
        path.unlink()
    model.eval()
    with pytest.raises(NaturalBiasError) as error:  # fairseq-train prints it as one line
        criterion(model, first_sentences(task, "valid"))
    text = str(error.value)
    assert text.startswith("criterion unigram_label_smoothed_cross_")
    assert f"{data}/train.src-tgt.tgt.bin" in text
    assert "--criterion label_smoothed_cross_entropy" in text


@pytest.mark.training
def test_fairseq_train_translation_and_language_model(tmp_path, toy_bin, toy_lm_bin):
    """Through fairseq-train: finite losses, the smoothed loss beside the NLL,
    in training and validation; the LM task counts its next-token targets
    (no warning that they differ from the LM's bias)."""
    out = train(
        toy_bin, tmp_path / "mt", "--no-save", *ULS, "--log-format", "simple", max_update=3
    ).stdout
    for tag in ("train_inner", "valid"):
        records = log_records(out, tag)
        assert records and all(
            math.isfinite(r["loss"]) and math.isfinite(r["nll_loss"]) and r["loss"] != r["nll_loss"]
            for r in records
        )
    result = train_lm(toy_lm_bin, tmp_path / "lm", *ULS, "--no-save", max_update=2)
    records = log_records(result.stdout, "train_inner")
    assert len(records) == 2 and all(r["loss"] != r["nll_loss"] for r in records)
    assert "differs" not in result.stdout + result.stderr
