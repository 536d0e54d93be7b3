"""The output bias scaled at generation: logits ``g W phi + lambda b``
(Kobayashi et al., 2023, "Transformer Language Models Handle Word Frequency
in Prediction Head": lambda < 1 weakens the frequency prior, for more
diverse output; lambda = 1 is the model as trained).

    processor = BiasScaleLogitsProcessor(model, 0.5)
    model.generate(**inputs, logits_processor=LogitsProcessorList([processor]))
"""

import torch
from transformers import LogitsProcessor

from natbias import head
from natbias.errors import NaturalBiasError


class BiasScaleLogitsProcessor(LogitsProcessor):
    """Replaces b by ``scale`` * b in the next-token scores, renormalised: beam
    search hands processors log-probabilities and compares them across beams."""

    def __init__(self, model, scale: float):
        bias = getattr(model, "bias_in_logits", None)
        if bias is None:
            raise NaturalBiasError(f"{type(model).__name__} has no natural bias to scale")
        # b as the logits see it (f(b) where the model scales or caps them).
        shift = head.generation_shift(bias().detach(), scale)
        self.shift = torch.zeros(()) if shift is None else shift

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        shifted = scores.float() + self.shift.to(scores.device)
        return torch.log_softmax(shifted, dim=-1).to(scores.dtype)
