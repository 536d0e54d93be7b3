"""``unigram_regularized_cross_entropy``: label-smoothed cross-entropy that
pushes the model away from the target unigram early in training (App. A.4).

Meister et al. (2023), App. A.4: "we instead minimise the objective

    KL(p || p_theta) - lambda KL(omega(p) || p_theta)

for empirical distribution p and the unigram distribution of this empirical
distribution omega(p) [...] for the initial steps of training, then switching
back to the standard objective KL(p || p_theta)."

Here p is the label-smoothed empirical distribution (``--label-smoothing``)
and omega the target unigram (the model's own prior, or the targets counted:
:func:`fairseq_natbias.training_data.criterion_prior`), taken when training
begins and only if the term can be on. H(omega) being constant, the term
added to each target token's loss is ``lambda * sum_v omega(v) log p(v)``.
Its switch, clamp and logs: docs/criteria.md. The switch reads fairseq's
update counter, which fairseq 0.12's trainer never tells a criterion:
:mod:`fairseq_natbias.task_hooks` passes it on from ``task.train_step``.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterionConfig,
    label_smoothed_nll_loss,
)
from fairseq.logging import metrics
from omegaconf import II

from fairseq_natbias import task_hooks
from fairseq_natbias.unigram_label_smoothed_cross_entropy import TargetUnigramCriterion
from natbias.errors import NaturalBiasError
from natbias.label_smoothing import PAPER_EPSILON, unigram_cross_entropy
from natbias.statistics import LN2

logger = logging.getLogger(__name__)

NAME = "unigram_regularized_cross_entropy"
# Keys this criterion adds to every training logging output (the same keys on
# every worker: fairseq's fast all-reduce stacks values key by key).
REG_SUM, CLAMPED, REG_TOKENS = "unigram_reg", "unigram_clamped", "unigram_reg_tokens"
DEFAULT_CLAMP = 2.0  # multiples of ln|V|


@dataclass
class UnigramRegularizedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    label_smoothing: float = field(
        default=PAPER_EPSILON,
        metadata={"help": f"epsilon for label smoothing (the paper's {PAPER_EPSILON:g})"},
    )
    unigram_reg_weight: Optional[float] = field(
        default=None,
        metadata={
            "help": "lambda >= 0 of App. A.4: weight of -KL(unigram || "
            "p_theta) (required; the paper gives no value)"
        },
    )
    unigram_reg_updates: Optional[int] = field(
        default=None,
        metadata={
            "help": "use the regulariser for the first N updates, then the "
            "standard objective (required; 0 switches it off)"
        },
    )
    unigram_reg_clamp: float = field(
        default=DEFAULT_CLAMP,
        metadata={
            "help": "bound on each token's unigram cross-entropy, in "
            "multiples of ln|V| (inf: no bound; the objective is then "
            "unbounded below)"
        },
    )
    train_subset: str = II("dataset.train_subset")


@register_criterion(NAME, dataclass=UnigramRegularizedCrossEntropyConfig)
class UnigramRegularizedCrossEntropyCriterion(TargetUnigramCriterion):
    _clamp_warned = False  # one warning per process, from reduce_metrics

    name = NAME

    def __init__(
        self,
        task,
        sentence_avg,
        label_smoothing,
        unigram_reg_weight,
        unigram_reg_updates,
        unigram_reg_clamp=DEFAULT_CLAMP,
        train_subset="train",
        ignore_prefix_size=0,
        report_accuracy=False,
    ):
        args = (sentence_avg, label_smoothing, train_subset, ignore_prefix_size, report_accuracy)
        super().__init__(task, *args)
        self.weight, self.reg_updates, self.clamp = _check_options(
            unigram_reg_weight, unigram_reg_updates, unigram_reg_clamp
        )
        self.num_updates = 0
        self._pending = None
        # Told the update number before each step, prepared when an epoch begins.
        task_hooks.attach(task, regularizer=self)

    # --- the switch -----------------------------------------------------------

    def set_num_updates(self, num_updates: int) -> None:
        """Updates finished before the current one (fairseq's counter)."""
        self.num_updates = int(num_updates)

    def regularizing(self, model) -> bool:
        """On for updates 1..N (``num_updates`` < N), in training only."""
        return self.weight > 0 and self.num_updates < self.reg_updates and model.training

    # --- the loss -------------------------------------------------------------

    def forward(self, model, sample, reduce=True):
        self._pending = None
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        if model.training:
            zero = loss.detach().new_zeros(())  # tensors on every worker alike
            reg_sum, clamped, tokens = self._pending or (zero, zero, zero)
            logging_output.update({REG_SUM: reg_sum, CLAMPED: clamped, REG_TOKENS: tokens})
        self._pending = None
        return loss, sample_size, logging_output

    def compute_loss(self, model, net_output, sample, reduce=True):
        """label_smoothed_cross_entropy's loss, plus (while regularising)
        ``lambda * sum_v omega(v) log p_theta(v|y_<t)`` for each target token."""
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        loss, nll_loss = label_smoothed_nll_loss(
            lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=reduce
        )
        if self.regularizing(model):
            reg, clamped = self.unigram_term(lprobs, target, model)
            self._pending = (reg.sum().detach(), clamped, target.ne(self.padding_idx).sum())
            loss = loss + (reg.sum() if reduce else reg.view_as(loss))
        return loss, nll_loss

    def unigram_term(self, lprobs, target, model):
        """Per token: ``lambda * max(sum_v omega(v) log p_theta(v), -B)``, 0 at
        padding, with B = clamp * ln|V|; and how many tokens hit B."""
        cross = -unigram_cross_entropy(lprobs, self.omega(lprobs, model))  # float32
        bound = self.clamp * math.log(lprobs.size(-1))
        keep = target.ne(self.padding_idx)
        clamped = (cross.detach() < -bound) & keep
        cross = cross.clamp(min=-bound)
        return self.weight * cross.masked_fill(~keep, 0.0), clamped.sum()

    def prepare(self, model=None) -> None:
        """Count omega if the term can ever be on: called when training begins
        (``task.begin_epoch``), so missing data fails before the first update,
        while ``fairseq-validate`` (validation never uses the term) needs no
        training data."""
        if self.weight > 0 and self.reg_updates > 0:
            try:
                super().prepare(model)
            except NaturalBiasError as error:
                raise NaturalBiasError(
                    f"{error} (or switch the regulariser off with --unigram-reg-updates 0)"
                ) from None

    # --- logging --------------------------------------------------------------

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        if not any(REG_SUM in log for log in logging_outputs):
            return  # validation
        reg = sum(float(log.get(REG_SUM, 0.0)) for log in logging_outputs)
        clamped = sum(int(log.get(CLAMPED, 0)) for log in logging_outputs)
        tokens = sum(int(log.get(REG_TOKENS, 0)) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar(REG_SUM, reg / max(sample_size, 1) / LN2, sample_size, round=3)
        metrics.log_scalar(CLAMPED, clamped / max(tokens, 1), tokens, round=4)
        if clamped and not cls._clamp_warned:
            cls._clamp_warned = True
            logger.warning(
                "unigram regulariser: %d of %d target tokens reached the bound "
                "--unigram-reg-clamp (their unigram cross-entropy is clamped, their "
                "gradient from the term is 0). Without the bound -lambda KL(unigram "
                "|| p_theta) is unbounded below and training would run away; "
                "consider a smaller --unigram-reg-weight or --unigram-reg-updates.",
                clamped,
                tokens,
            )


def _check_options(weight, updates, clamp):
    fix = (
        f"criterion {NAME} needs --unigram-reg-weight LAMBDA (>= 0) and "
        "--unigram-reg-updates N (>= 0), e.g. --unigram-reg-weight 0.1 "
        "--unigram-reg-updates 4000"
    )
    if weight is None or updates is None:
        missing = "--unigram-reg-weight" if weight is None else "--unigram-reg-updates"
        raise NaturalBiasError(f"{missing} is not set: the paper (App. A.4) gives no value. {fix}")
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
        raise NaturalBiasError(
            f"--unigram-reg-weight must be a finite number >= 0, got {weight!r}. {fix}"
        )
    if isinstance(updates, bool) or int(updates) != updates or updates < 0:
        raise NaturalBiasError(
            f"--unigram-reg-updates must be an integer >= 0, got {updates!r}. {fix}"
        )
    if not (isinstance(clamp, (int, float)) and clamp > 0):
        raise NaturalBiasError(
            f"--unigram-reg-clamp must be > 0 (a multiple of ln|V|; inf for no "
            f"bound), got {clamp!r}"
        )
    return float(weight), int(updates), float(clamp)
