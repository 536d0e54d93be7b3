"""``unigram_label_smoothed_cross_entropy``: label smoothing towards the
target unigram omega instead of the uniform distribution (Chorowski and Jaitly,
2017; Pereyra et al., 2017: :mod:`natbias.label_smoothing`; docs/criteria.md). omega is taken on first
use, as fairseq builds the criterion before it loads any data.
"""

from dataclasses import dataclass, field

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from omegaconf import II

from fairseq_natbias.training_data import criterion_prior
from natbias.errors import NaturalBiasError
from natbias.label_smoothing import PAPER_EPSILON, check_epsilon, unigram_smoothed_loss

NAME = "unigram_label_smoothed_cross_entropy"


@dataclass
class UnigramLabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=PAPER_EPSILON,
        metadata={
            "help": "epsilon: the mass moved from the reference token to "
            f"the target unigram (the paper's {PAPER_EPSILON:g})"
        },
    )
    train_subset: str = II("dataset.train_subset")


class TargetUnigramCriterion(LabelSmoothedCrossEntropyCriterion):
    """What both unigram criteria share (this one and
    ``unigram_regularized_cross_entropy``): label_smoothed_cross_entropy's
    arguments and ``--train-subset``, and omega, the target unigram, taken once
    (:func:`training_data.criterion_prior`) and kept per device."""

    name = NAME  # the criterion named in a refusal

    def __init__(self, task, sentence_avg, label_smoothing, train_subset, *options):
        """``options``: label_smoothed_cross_entropy's own after ``label_smoothing``."""
        super().__init__(task, sentence_avg, label_smoothing, *options)
        self.train_subset = train_subset
        self._omega = None  # omega(v), float32 on the CPU, taken by prepare()
        self._prior = {}  # device -> omega there

    def prepare(self, model=None) -> None:
        if self._omega is None:
            self._omega = criterion_prior(self.task, model, self.train_subset, self.name).exp()

    def omega(self, like, model=None):
        """omega(v), float32 on ``like``'s device."""
        if like.device not in self._prior:
            self.prepare(model)
            self._prior[like.device] = self._omega.to(like.device)
        return self._prior[like.device]


@register_criterion(NAME, dataclass=UnigramLabelSmoothedCrossEntropyConfig)
class UnigramLabelSmoothedCrossEntropyCriterion(TargetUnigramCriterion):
    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        train_subset="train",
        ignore_prefix_size=0,
        report_accuracy=False,
    ):
        try:
            check_epsilon(label_smoothing)
        except NaturalBiasError as error:
            raise NaturalBiasError(f"criterion {NAME}: {error}") from None
        args = (sentence_avg, label_smoothing, train_subset, ignore_prefix_size, report_accuracy)
        super().__init__(task, *args)

    def compute_loss(self, model, net_output, sample, reduce=True):
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        prior = self.omega(lprobs, model) if self.eps > 0 else None
        loss, nll = unigram_smoothed_loss(lprobs, target, prior, self.eps, self.padding_idx)
        if reduce:
            return loss.sum(), nll.sum()
        return loss, nll
