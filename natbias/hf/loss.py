"""Label smoothing towards the unigram as a loss the transformers ``Trainer``
and ``Seq2SeqTrainer`` take (``compute_loss_func``); the method and its
credits: :mod:`natbias.label_smoothing`.

    loss = UnigramLabelSmoothingLoss.from_model(model, epsilon=0.1)
    trainer = Seq2SeqTrainer(model, args, ..., compute_loss_func=loss)

Reduced as the Trainer's contract for ``compute_loss_func`` asks: the sum
over the micro-batch's target tokens (labels other than -100) divided by
``num_items_in_batch``, the target tokens of the whole update (every
accumulated micro-batch, on every process where the Trainer gathers them).
The Trainer then neither divides by the accumulation steps nor averages over
processes, so 8 x 1, 4 x 2 and 2 processes x 4 train the same model. Called
alone (``num_items_in_batch`` None) it is the mean over its own tokens.
"""

from collections.abc import Sequence
from typing import Optional

import torch

from natbias.counts import IGNORE_INDEX
from natbias.errors import NaturalBiasError
from natbias.label_smoothing import PAPER_EPSILON, check_epsilon, unigram_smoothed_loss
from natbias.prior import DEFAULT_SMOOTHING, log_unigram


class UnigramLabelSmoothingLoss:
    """``compute_loss_func(outputs, labels, num_items_in_batch)`` of
    ``(1 - eps) (-log p(y)) + eps CE(omega, p)`` per target token.
    ``causal``: the logits at t predict the label at t + 1 (decoder-only
    models, whose labels are their inputs)."""

    def __init__(
        self, log_prior: torch.Tensor, epsilon: float = PAPER_EPSILON, causal: bool = False
    ):
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.prior = log_prior.detach().float().exp()
        self.causal = causal

    @classmethod
    def from_model(cls, model, epsilon: float = PAPER_EPSILON) -> "UnigramLabelSmoothingLoss":
        """omega: the prior of a model given the natural bias (``add_natural_bias``)."""
        log_prior = getattr(model, "natbias_log_prior", None)
        if log_prior is None:
            raise NaturalBiasError(
                f"{type(model).__name__} has no natural bias: give the "
                "training targets' counts with from_counts"
            )
        return cls(log_prior, epsilon, _is_causal(model))

    @classmethod
    def from_counts(
        cls,
        counts: Sequence[int],
        model,
        epsilon: float = PAPER_EPSILON,
        smoothing: float = DEFAULT_SMOOTHING,
    ) -> "UnigramLabelSmoothingLoss":
        """omega counted (``natbias.hf.count_targets``) for a model without the
        natural bias, smoothed as the bias would be."""
        return cls(log_unigram(counts, smoothing), epsilon, _is_causal(model))

    def __call__(
        self, outputs, labels: torch.Tensor, num_items_in_batch: Optional[int] = None
    ) -> torch.Tensor:
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        if self.causal:
            logits, labels = logits[..., :-1, :], labels[..., 1:]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        loss, _ = unigram_smoothed_loss(log_probs, labels, self.prior, self.epsilon, IGNORE_INDEX)
        if num_items_in_batch is None:
            return loss.sum() / labels.ne(IGNORE_INDEX).sum().clamp(min=1)
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        return loss.sum() / num_items_in_batch


def _is_causal(model) -> bool:
    return not getattr(model.config, "is_encoder_decoder", False)
