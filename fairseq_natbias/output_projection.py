"""The decoder's final projection ``W phi + b`` (the paper's eq. 1) and its
initialisation.

    p_theta(y | y_<t) = softmax(W phi(y_<t) + b)_y                        (1)
                      ∝ p_Wphi(y | y_<t) * p_b(y)                         (4)

fairseq's transformer decoder builds ``output_projection`` as an
``nn.Linear(d, |V|, bias=False)`` (its weight shared with the embeddings when
tied). We give that same Linear a bias; its state-dict key is
``decoder.output_projection.bias``.

Weight initialisation schemes (``--natbias-weight-init``), applied the same
way whatever the bias, so that unigram / zero / none differ in the bias alone:

``gain`` (default)
    fairseq's own W, and one learnt scalar gain g on the contextual logits::

        logits = g * W phi + b,      g = speed * u   (u the learnt parameter)

    g starts at ``--natbias-gain-init`` (0.05), so a fresh model predicts
    softmax(b), the unigram (Fig. 1 at update 0), and ``speed``
    (``--natbias-gain-speed``, 20) makes Adam, whose steps on u are about one
    learning rate whatever the gradient's scale, move g about ``speed``
    learning rates per update: the contextual logits regrow within tens of
    updates instead of the hundreds ``damped`` needs. Adam's steps on W and phi
    are not slowed by the small g (Adam divides the gradient by its own scale).
    g multiplies phi before the projection (W (g phi) + b), which costs a
    (tokens x d) product, not a (tokens x |V|) one. Chosen as the default by the
    learning-efficiency study (docs/weight_init.md).
``fairseq``
    fairseq's own init, untouched: N(0, d^-1/2) untied, the embedding when tied.
    The model is the stock transformer plus a bias. A fresh tied model predicts
    the unigram only roughly (10.7-11.0 bits against the unigram's 8.1 on
    Multi30k De-En): the decoder output still carries the input token.
``damped``
    fairseq's own W, and the gain of the layer norm that produces phi starts at
    ``--natbias-feature-gain`` (0.1) instead of 1. Starts at the unigram, but
    Adam grows each of the d gains back by about one learning rate per update,
    so the contextual logits stay damped for hundreds of updates and every bias
    learns slower than with ``fairseq``.
``paper``
    the paper's sec. 4.1 read literally: W element-wise from N(0, 1/sqrt(d))
    (variance 1/sqrt(d)), then rescaled so that ||W||_F equals the l2 norm of
    the target log-unigram. With tied embeddings this rescales the shared
    embedding matrix too. The reference norm is the log-unigram's also for
    ``zero`` and ``none`` (their own bias norm is 0 or absent).
"""

import logging
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

WEIGHT_INITS = ("gain", "fairseq", "damped", "paper")
DEFAULT_WEIGHT_INIT = "gain"
DEFAULT_GAIN_INIT = 0.05
DEFAULT_GAIN_SPEED = 20.0


class GainedLinear(nn.Linear):
    """``W (g x) + b``: fairseq's output projection with a learnt scalar gain
    ``g = speed * u`` on its input (weight init ``gain``).

    Built around the decoder's existing weight (and bias) Parameters, so tied
    embeddings stay tied and no random numbers are drawn: every other
    parameter is the one the stock model draws with the same seed. Its state
    keys are ``weight``, ``bias`` (when there is one) and ``gain_param`` (u).
    """

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter],
                 gain_init: float, speed: float):
        nn.Module.__init__(self)  # not nn.Linear's: it would draw a new W
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias
        self.speed = float(speed)
        self.gain_param = nn.Parameter(
            torch.tensor(float(gain_init) / self.speed, dtype=weight.dtype,
                         device=weight.device)
        )

    def gain(self) -> torch.Tensor:
        return self.gain_param * self.speed

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features * self.gain().to(features.dtype), self.weight, self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gain=speed*u, speed={self.speed:g}"


def add_output_gain(decoder, gain_init: float, speed: float) -> GainedLinear:
    """Replace ``decoder.output_projection`` by a :class:`GainedLinear` that
    shares its weight and bias."""
    for name, value in (("--natbias-gain-init", gain_init), ("--natbias-gain-speed", speed)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    projection = decoder.output_projection
    gained = GainedLinear(projection.weight, projection.bias, gain_init, speed)
    decoder.output_projection = gained
    return gained


def output_gain(decoder) -> Optional[torch.Tensor]:
    """The scalar gain g on ``W phi`` (weight init ``gain``), else None."""
    projection = getattr(decoder, "output_projection", None)
    return projection.gain() if isinstance(projection, GainedLinear) else None


def contextual_weight_norm(decoder) -> float:
    """||g W||_F: the norm of the matrix that maps phi to the contextual logits
    (||W||_F for the weight inits without a gain)."""
    norm = decoder.output_projection.weight.detach().float().norm()
    gain = output_gain(decoder)
    if gain is not None:
        norm = norm * gain.detach().float().abs()
    return norm.item()


def attach_output_bias(
    decoder, values: Optional[torch.Tensor], freeze: bool = False
) -> None:
    """Give ``decoder.output_projection`` a bias initialised to ``values``.

    ``values=None`` leaves the projection without a bias (the paper's "no bias"
    baseline, fairseq's default).
    """
    if values is None:
        return
    projection = decoder.output_projection
    if values.shape != (projection.out_features,):
        raise ValueError(
            f"bias has {tuple(values.shape)} entries, the output layer "
            f"{projection.out_features}"
        )
    projection.bias = nn.Parameter(
        values.to(projection.weight.dtype).clone(), requires_grad=not freeze
    )


def output_bias(decoder) -> Optional[torch.Tensor]:
    projection = getattr(decoder, "output_projection", None)
    return None if projection is None else projection.bias


def feature_norm(decoder) -> Optional[nn.Module]:
    """The layer norm whose output is phi: the decoder's final norm (pre-norm)
    or the last layer's ``final_layer_norm`` (post-norm)."""
    if getattr(decoder, "layer_norm", None) is not None:
        return decoder.layer_norm
    layers = getattr(decoder, "layers", None)
    if layers and not getattr(layers[-1], "normalize_before", True):
        return getattr(layers[-1], "final_layer_norm", None)
    return None


def init_output_weights(
    decoder, scheme: str, reference_norm: Optional[float], feature_gain: float
) -> None:
    """W's init for the schemes that change W or phi's norm (``damped``,
    ``paper``); ``gain`` and ``fairseq`` keep fairseq's W (the gain itself is
    added by :func:`add_output_gain`, also when a checkpoint is loaded)."""
    if scheme in ("fairseq", "gain"):
        return
    if scheme == "damped":
        _damp_features(decoder, feature_gain)
    elif scheme == "paper":
        _paper_init(decoder, reference_norm)
    else:
        raise ValueError(
            f"--natbias-weight-init {scheme!r}: choose one of {', '.join(WEIGHT_INITS)}"
        )


def _damp_features(decoder, gain: float) -> None:
    if not (math.isfinite(gain) and gain > 0):
        raise ValueError(
            f"--natbias-feature-gain must be a finite number > 0, got {gain!r}"
        )
    norm = feature_norm(decoder)
    if norm is None or getattr(norm, "weight", None) is None:
        logger.warning(
            "natbias: the decoder has no final layer norm with a gain; "
            "--natbias-weight-init damped scales the untied output weights instead"
        )
        if decoder.share_input_output_embed:
            raise ValueError(
                "--natbias-weight-init damped needs a decoder final layer norm "
                "when embeddings are tied; use --natbias-weight-init fairseq or paper"
            )
        with torch.no_grad():
            decoder.output_projection.weight.mul_(gain)
        return
    with torch.no_grad():
        norm.weight.fill_(gain)


def _paper_init(decoder, reference_norm: Optional[float]) -> None:
    if reference_norm is None or not reference_norm > 0:
        raise ValueError(
            "--natbias-weight-init paper rescales W to the norm of the target "
            "log-unigram, which is unknown here"
        )
    weight = decoder.output_projection.weight
    d = weight.shape[1]
    with torch.no_grad():
        weight.normal_(mean=0.0, std=d ** -0.25)  # variance 1/sqrt(d)
        weight.mul_(reference_norm / weight.norm())
    if decoder.share_input_output_embed:
        logger.info(
            "natbias: --natbias-weight-init paper rescaled the shared embedding "
            "matrix to ||W||_F = %.1f (it is the output projection too)",
            reference_norm,
        )
