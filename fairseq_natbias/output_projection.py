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

``fairseq`` (default)
    fairseq's own init, untouched: N(0, d^-1/2) untied, the embedding when tied.
    The default because it trained best in our learning-efficiency study
    (Multi30k De-En, 3 seeds x 1,000 updates: lowest validation NLL, highest
    validation and test BLEU for every bias; README, "Benchmarks"), although a
    fresh model with it predicts the unigram only roughly (validation NLL 10.7
    bits against the unigram's 8.1, tied).
``damped``
    fairseq's own W, and the gain of the layer norm that produces phi starts at
    ``--natbias-feature-gain`` (0.1) instead of 1, so the contextual logits
    ``W phi`` start ten times smaller and the fresh model's output is close to
    ``softmax(b)`` (Fig. 1 at update 0: 8.13 bits against the unigram's 8.10).
    Works the same for tied and untied projections (the shared embedding matrix
    is left as it is, so the decoder input is unchanged). Adam grows the gain
    back by about the learning rate per update, so the contextual logits stay
    damped for hundreds of updates: in our study it learnt markedly slower than
    ``fairseq`` whatever the bias.
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
from torch import nn

logger = logging.getLogger(__name__)

WEIGHT_INITS = ("fairseq", "damped", "paper")
DEFAULT_WEIGHT_INIT = "fairseq"


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
    if scheme == "fairseq":
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
