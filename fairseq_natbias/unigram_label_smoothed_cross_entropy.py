"""``unigram_label_smoothed_cross_entropy``: label smoothing towards the
target unigram instead of the uniform distribution.

fairseq's ``label_smoothed_cross_entropy`` (the paper's objective, sec. 4.1,
epsilon = 0.1) trains each target position towards

    q(v) = (1 - epsilon) 1[v = y] + epsilon u(v),      u uniform over V

(to within 1/|V|). This criterion puts the smoothing mass on the target
training unigram omega instead (label smoothing with a unigram prior;
Szegedy et al., 2016, sec. 7, leave the prior open, Gao et al., 2020, AACL,
compare priors for MT):

    q(v) = (1 - epsilon) 1[v = y] + epsilon omega(v)

so the loss of one target token is the cross-entropy

    CE(q, p_theta) = (1 - epsilon) (-log p_theta(y | y_<t))
                     + epsilon CE(omega, p_theta(. | y_<t)),
    CE(omega, p_theta) = -sum_v omega(v) log p_theta(v | y_<t).

Why beside the natural bias. A model that ignores its context (W phi = 0:
the natural-bias model at update 0) predicts one distribution p everywhere;
its expected loss under this target is (1 - epsilon) CE(omega, p) +
epsilon CE(omega, p) = CE(omega, p), least at p = omega. So the natural bias
b = log omega (eq. 3) is exactly where this objective wants the context-free
part of the model, for the whole run. Under uniform smoothing that optimum is
(1 - epsilon) omega + epsilon/|V| instead, which the context has to learn to
undo. omega keeps its end-of-sentence entry for the same reason: without
it, log omega would no longer be that optimum. A prior without EOS was
screened at 3,000 pairs (seeds 1-3): 0.01 bits lower, BLEU and output
length no better (docs/studies/small_corpora.md, "The end of sentence in
the prior").
Measured on Multi30k (3,000 and 10,000 pairs, 2+2 layers, CPU): the
natural-bias default with this criterion ends 0.08-0.16 bits of best
validation NLL below stock fairseq with its own; stock's model with this
criterion gets 0.07-0.13 of that, so most of the gain is the criterion's;
on all 29,000 pairs (20,000 updates, 3 seeds) 0.05-0.07 bits below stock,
where the default alone ends level
(docs/studies/small_corpora.md#label-smoothing-towards-the-unigram-070).

omega is counted, add-alpha smoothed, by the counter the models use for their
bias (``fairseq_natbias.unigram``, ``--unigram-smoothing`` = the models'
``--natbias-smoothing``, 1.0 by default; a warning if the two differ), on
first use: fairseq builds the criterion before it loads any data. Logged like
fairseq's criterion: ``loss`` is CE(q, p_theta) per token (bits), training and
validation alike, ``nll_loss`` the plain NLL; ``--label-smoothing 0`` is
exactly ``label_smoothed_cross_entropy`` with 0 (omega is then never counted).
"""

from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from omegaconf import II

from fairseq_natbias import unigram

NAME = "unigram_label_smoothed_cross_entropy"


@dataclass
class UnigramLabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=0.1,
        metadata={"help": "epsilon: the mass moved from the reference token to "
                  "the target unigram (the paper's 0.1)"},
    )
    unigram_smoothing: float = field(
        default=1.0,
        metadata={"help": "add-alpha smoothing of the unigram counts, as "
                  "--natbias-smoothing (keep the two equal)"},
    )
    train_subset: str = II("dataset.train_subset")


@register_criterion(NAME, dataclass=UnigramLabelSmoothedCrossEntropyConfig)
class UnigramLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(
        self, task, sentence_avg, label_smoothing, unigram_smoothing=1.0,
        train_subset="train", ignore_prefix_size=0, report_accuracy=False,
    ):
        _check_options(label_smoothing, unigram_smoothing)
        super().__init__(
            task, sentence_avg, label_smoothing,
            ignore_prefix_size=ignore_prefix_size, report_accuracy=report_accuracy,
        )
        self.unigram = unigram.TrainingUnigram(
            task, train_subset, unigram_smoothing, NAME,
            fix="The smoothing prior is counted on the training split named by "
                "--train-subset; or train with --criterion label_smoothed_cross_entropy.",
        )

    def compute_loss(self, model, net_output, sample, reduce=True):
        """Per target token ``(1 - eps) (-log p(y)) + eps CE(omega, p)``; the
        NLL beside it, both 0 at padding and summed when ``reduce``."""
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        padding = target.eq(self.padding_idx)
        nll = -lprobs.gather(dim=-1, index=target.unsqueeze(-1)).squeeze(-1)
        nll = nll.masked_fill(padding, 0.0)
        loss = nll
        if self.eps > 0:
            loss = (1.0 - self.eps) * nll + self.eps * self.unigram_cross_entropy(
                lprobs, model).masked_fill(padding, 0.0)
        if reduce:
            return loss.sum(), nll.sum()
        return loss, nll

    def unigram_cross_entropy(self, lprobs, model):
        """``-sum_v omega(v) log p(v)`` for each row of ``lprobs``: one product
        with omega, in float32 even under --amp (whose autocast would run the
        product in half precision)."""
        first_use = not self.unigram.counted
        lprobs = lprobs.float()  # fairseq's are float32 already: no copy
        omega = self.unigram.probs_like(lprobs)
        if first_use:
            self.unigram.warn_if_not_the_models(model, "--unigram-smoothing")
        with torch.autocast(device_type=lprobs.device.type, enabled=False):
            return -torch.matmul(lprobs, omega)


def _check_options(label_smoothing, alpha):
    if not (isinstance(label_smoothing, (int, float)) and 0 <= label_smoothing < 1):
        raise ValueError(
            f"criterion {NAME}: --label-smoothing must be in [0, 1), got "
            f"{label_smoothing!r} (the paper's is 0.1; 0 is plain cross-entropy)"
        )
    unigram.check_smoothing(alpha, "--unigram-smoothing")
