"""The natural-bias head's mathematics, written once: every engine (fairseq,
transformers, vLLM, CTranslate2, OLMo-core) calls these and derives none of
them again.

The output layer (the paper's eq. 1, with the package's gain g on W phi)::

    logits = g W phi + b[row]          g = min(|C u|, 1)                  (1)

b starts as the log prior (:func:`natbias.prior.log_unigram`); ``row`` picks
one row of a bias that has one per condition (a target language), row 0 the
pooled prior. At generation (Kobayashi et al., 2023: lambda; logit
adjustment: tau)::

    logits = g W phi + lambda b[row] - tau log p[row]

An export that has no gain folds it into the weight: ``(g W) phi + b``.
What a saved model records is versioned (:data:`natbias.FORMAT_VERSION`),
and :func:`check_format_version` is the one check of it.
"""

from typing import Optional, Union

import numpy as np
import torch

from natbias import FORMAT_VERSION, __version__
from natbias.errors import NaturalBiasError

DEFAULT_GAIN_INIT = 0.05
DEFAULT_GAIN_SPEED = 20.0
GAIN_CAP = 1.0


def gain(gain_param: torch.Tensor, speed: float) -> torch.Tensor:
    """g = min(|C u|, 1), in u's dtype (float32: the models keep u so). It
    starts at 0.05, so that a fresh model predicts softmax(b), the unigram,
    even where a random W phi is large; Adam moves u about one learning rate
    an update, so g moves about C (20) and W phi regrows within tens of
    updates. Where C u would cross zero g turns back up instead of changing
    sign; past 1 its gradient is 0 and the layer is the paper's ``W phi + b``."""
    return torch.clamp((gain_param * speed).abs(), max=GAIN_CAP)


def initial_gain_param(gain_init: Optional[float], speed: float) -> float:
    """u at the start, so that g starts at ``gain_init`` (default 0.05)."""
    gain_init = DEFAULT_GAIN_INIT if gain_init is None else gain_init
    check_gain(gain_init, speed)
    return gain_init / speed


def check_gain(gain_init: float, speed: float) -> None:
    for name, value in (("gain init", gain_init), ("gain speed", speed)):
        if isinstance(value, bool) or not (
            isinstance(value, (int, float)) and np.isfinite(value) and value > 0
        ):
            raise NaturalBiasError(f"the {name} must be a finite number > 0, got {value!r}")
    if gain_init >= GAIN_CAP:
        raise NaturalBiasError(
            f"the gain init {gain_init:g} is not below the gain's cap of "
            f"{GAIN_CAP:g}: start it below (default {DEFAULT_GAIN_INIT:g}), "
            "or train without the gain for g = 1"
        )


Weight = Union[torch.Tensor, np.ndarray]


def fold_gain(weight: Weight, g: float, in_place: bool = False) -> Weight:
    """``g W``, for an engine without the gain: ``(g W) phi = g (W phi)``. A
    new tensor (an embedding that shares W keeps it) unless ``in_place``; in
    the weight's own dtype, as the engine will multiply."""
    g = float(g)
    if g == 1.0:
        return weight
    if isinstance(weight, np.ndarray):
        return weight * weight.dtype.type(g)
    return weight.mul_(g) if in_place else weight * g


def per_language(values: torch.Tensor) -> bool:
    """Whether a prior (or bias) holds one row per target language, row 0 pooled."""
    return values.dim() == 2


def bias_rows(bias: torch.Tensor, rows: Optional[torch.Tensor]) -> torch.Tensor:
    """``b[row]`` for each position (``rows``: the positions' shape), or b
    itself where it has one row."""
    if not per_language(bias):
        return bias
    if rows is None:
        raise NaturalBiasError(
            "this output layer has one bias row per target language: call it with "
            "the rows (the decoder does), or export one language's row"
        )
    return bias[rows]


def all_rows(values: torch.Tensor) -> torch.Tensor:
    """A prior (or bias) as ``(rows, |V|)``: one row, or row 0 pooled and then
    one per target language."""
    return values.reshape(-1, values.shape[-1])


def pooled_row(values: torch.Tensor) -> torch.Tensor:
    """The pooled prior (or bias) of values with one row per target language
    (row 0), or the values themselves where they have one row."""
    return all_rows(values)[0]


def generation_shift(
    bias: Optional[torch.Tensor],
    scale: Union[float, torch.Tensor] = 1.0,
    log_prior: Optional[torch.Tensor] = None,
    adjustment: float = 0.0,
) -> Optional[torch.Tensor]:
    """What turns a model's logits ``g W phi + b`` into ``g W phi + lambda b -
    tau log p``: ``(lambda - 1) b - tau log p``, in float32; ``bias`` and
    ``log_prior`` are each position's row (:func:`bias_rows`), as the logits
    see them; ``scale`` a number, or a column of them (one lambda a row).
    None where there is nothing to add (lambda 1, tau 0)."""
    shift = None
    if bias is not None and not (isinstance(scale, (int, float)) and scale == 1.0):
        factor = scale - 1.0  # in float64, then rounded once to float32, as for a number
        shift = (factor.float() if torch.is_tensor(factor) else factor) * bias.float()
    if adjustment != 0.0:
        if log_prior is None:
            raise NaturalBiasError("tau (logit adjustment) needs the model's log prior")
        adjusted = -float(adjustment) * log_prior.float()
        shift = adjusted if shift is None else shift + adjusted
    return shift


def check_format_version(version, where: str, required: bool = False) -> None:
    """Refuse, in one line, what a newer natbias saved; ``version`` None
    (nothing recorded) is refused where ``required``."""
    if (version is not None or required) and (
        not isinstance(version, int) or version > FORMAT_VERSION
    ):
        raise NaturalBiasError(
            f"{where} records natural-bias format {version!r}; natbias {__version__} "
            f"reads format {FORMAT_VERSION} and earlier: upgrade natbias to load it"
        )
