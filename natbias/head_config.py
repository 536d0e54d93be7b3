"""The head's settings as one configuration, in OLMo-core's style: a dataclass
checked once that builds the module. Every engine's ``add_natural_bias``
takes one (``config=``), its keyword arguments a thin front to it."""

from dataclasses import dataclass
from typing import Optional

import numpy as np

from natbias import FORMAT_VERSION, __version__
from natbias.counts import check_counts
from natbias.errors import NaturalBiasError
from natbias.head import DEFAULT_GAIN_INIT, DEFAULT_GAIN_SPEED, check_gain
from natbias.prior import DEFAULT_SMOOTHING, check_smoothing, log_unigram
from natbias.projection import NaturalBiasProjection


@dataclass(frozen=True)
class HeadConfig:
    """The prior's smoothing alpha; the gain g on W phi or not (g = 1), its
    start (None: the engine's, the core's 0.05) and speed C (:mod:`natbias.head`)."""

    smoothing: float = DEFAULT_SMOOTHING
    gain: bool = True
    gain_init: Optional[float] = None
    gain_speed: float = DEFAULT_GAIN_SPEED

    def __post_init__(self):
        check_smoothing(self.smoothing)
        if self.gain:
            check_gain(self.gain_settings()[0], self.gain_speed)

    @classmethod
    def of(cls, config: Optional["HeadConfig"] = None, **keywords) -> "HeadConfig":
        """``config``, else one of the keywords given (not None); not both."""
        given = {name: value for name, value in keywords.items() if value is not None}
        differ = [name for name, value in given.items() if getattr(config, name, value) != value]
        if differ:
            raise NaturalBiasError(
                f"{', '.join(differ)} differ from config=: give the head's settings one way"
            )
        return cls(**given) if config is None else config

    def gain_settings(self) -> tuple:
        """g's (start, speed); (None, None) without the gain."""
        start = DEFAULT_GAIN_INIT if self.gain_init is None else self.gain_init
        return (start, self.gain_speed) if self.gain else (None, None)

    def projection(self, weight, bias) -> NaturalBiasProjection:
        return NaturalBiasProjection(weight, bias, *self.gain_settings())

    def build(self, weight, counts) -> NaturalBiasProjection:
        """The projection whose b starts as the log prior of ``counts``,
        holding it (``natbias_log_prior``) and :meth:`saved` (``natbias_settings``)."""
        log_prior = log_unigram(counts, self.smoothing)
        projection = self.projection(weight, log_prior)
        projection.natbias_log_prior = log_prior
        projection.natbias_settings = self.saved(counts.sum())
        return projection

    def saved(self, prior_tokens) -> dict:
        """What a saved model records of its natural bias, the format version first."""
        gain_init, gain_speed = self.gain_settings()
        return {
            "format_version": FORMAT_VERSION,
            "written_by": f"natbias {__version__}",
            "smoothing": float(self.smoothing),
            "prior_tokens": int(prior_tokens),
            "gain_init": None if gain_init is None else float(gain_init),
            "gain_speed": None if gain_speed is None else float(gain_speed),
        }


def one_prior_source(**sources) -> None:
    given = [name for name, value in sources.items() if value is not None]
    if len(given) != 1:
        raise NaturalBiasError(
            f"give the prior as exactly one of {', '.join(sources)}; got {', '.join(given) or 'none'}"
        )


def checked_counts(counts, vocab_size: int) -> np.ndarray:
    shape = np.shape(counts)
    if shape != (vocab_size,):
        raise NaturalBiasError(
            f"{shape[0] if shape else 0} counts for an output layer of {vocab_size}: the counts "
            "are from another tokenizer (give one count per id of the model's vocabulary)"
        )
    return check_counts(counts, "the counts")
