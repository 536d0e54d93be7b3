"""The statistical prior: the smoothed log-unigram the natural bias starts from.

Add-alpha smoothing (Laplace for alpha = 1), so that every entry is finite,
also for tokens that never occur as targets (padding, begin-of-sentence)::

    p(v) = (c(v) + alpha) / (N + alpha |V|)
"""

import math
from collections.abc import Sequence

import numpy as np
import torch

from natbias.errors import NaturalBiasError

DEFAULT_SMOOTHING = 1.0


def check_smoothing(alpha: float, option: str = "--natbias-smoothing") -> float:
    """``alpha`` as a float, or the error naming ``option``."""
    if isinstance(alpha, bool) or not (
        isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0
    ):
        raise NaturalBiasError(
            f"{option} must be a finite number > 0, got {alpha!r}: tokens never seen as "
            f"targets would get log 0 = -inf (the default {DEFAULT_SMOOTHING:g} is add-one "
            "smoothing)"
        )
    return float(alpha)


def log_unigram(counts: Sequence[int], alpha: float = DEFAULT_SMOOTHING) -> torch.Tensor:
    """``log p(v) = log(c(v) + alpha) - log(N + alpha |V|)``: float32, all finite,
    computed in float64."""
    alpha = check_smoothing(alpha)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or counts.size == 0 or (counts < 0).any():
        raise NaturalBiasError("counts must be one non-negative count per vocabulary entry")
    smoothed = torch.from_numpy(counts) + alpha
    return (smoothed.log() - smoothed.sum().log()).float()
