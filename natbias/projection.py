"""The output layer with the natural bias (Meister et al., 2023, eq. 1,

    p(y | y_<t) = softmax(W phi(y_<t) + b)_y                                (1)

b starting as the log-unigram), with the gain (:mod:`natbias.head`): logits
``W (g phi) + b``. g multiplies phi, not the logits: a (tokens x d) product,
not a (tokens x |V|) one.

:class:`NaturalBiasProjection` shares the weight W it is given (tied
embeddings stay tied); its state keys are ``weight``, ``bias`` and
``gain_param`` (u, of shape (1,): :mod:`natbias.legacy_scalars` says why).
b and u stay float32 when the model is cast to half precision: a rare
token's bias (|b| >= 8, where bfloat16's spacing is 0.0625) could not move by
steps of one learning rate.

A model built on the meta device (as large models are, before sharding)
takes the natural bias there; b and u get their values when it is
materialised: ``to_empty``, then its initialisation, which calls
:meth:`NaturalBiasProjection.reset_parameters` (transformers'
``init_weights``, FSDP1's ``param_init_fn``, or the user's own loop).
"""

import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from natbias import head, legacy_scalars
from natbias.errors import NaturalBiasError
from natbias.sharding import fill_, replicated_like

logger = logging.getLogger(__name__)


class KeepsFloat32(nn.Module):
    """A module whose ``float32_parameters`` and ``float32_buffers`` stay
    float32 when the model is cast (``.half()``, bfloat16): they are taken out
    while the rest is cast, then only moved to the device of
    :meth:`_float32_device` (a round trip through half would lose precision)."""

    float32_parameters = ()
    float32_buffers = ()

    def _float32_device(self) -> torch.device:
        raise NotImplementedError

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        legacy_scalars.upgrade(self, state_dict, prefix, self.float32_parameters)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        if fn(torch.empty(0)).dtype == torch.float32:  # not a cast: a move, to_empty, ...
            return super()._apply(fn, *args, **kwargs)
        kept = _take(self._parameters, self.float32_parameters)
        buffers = _take(self._buffers, self.float32_buffers)
        try:
            module = super()._apply(fn, *args, **kwargs)
        finally:
            device = self._float32_device()
            for name, param in kept.items():
                param.data = param.data.to(device=device, dtype=torch.float32)
                self._parameters[name] = param
            for name, buffer in buffers.items():
                self._buffers[name] = buffer.to(device=device, dtype=torch.float32)
        return module


def _take(entries: dict, names) -> dict:
    """The named entries that are set, taken out of ``entries``."""
    return {name: entries.pop(name) for name in names if entries.get(name) is not None}


class _ScaleByGain(torch.autograd.Function):
    """``features * g`` whose backward reduces g's gradient in float32 and
    divides it by ``divisor`` (C d).

    Why: g's gradient sums over every target token and every feature, where
    other gradients sum over tokens only; under loss-scaled fp16 that sum
    overflows, in float32 it cannot. Divided by C d it is the mean of what d
    per-feature gains would get, so gradient norms and clipping see the
    network as without the gain. Adam's update is invariant to a constant
    scale of a parameter's gradient, so g moves as with the true gradient."""

    @staticmethod
    def forward(ctx, features, gain, divisor: float):
        ctx.save_for_backward(features, gain)
        ctx.divisor = divisor
        return features * gain.to(features.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        features, gain = ctx.saved_tensors
        grad_features = grad_gain = None
        if ctx.needs_input_grad[0]:
            grad_features = grad_output * gain.to(grad_output.dtype)
        if ctx.needs_input_grad[1]:
            total = torch.dot(grad_output.reshape(-1).float(), features.reshape(-1).float())
            grad_gain = (total / ctx.divisor).reshape(gain.shape).to(gain.dtype)
        return grad_features, grad_gain, None


class NaturalBiasProjection(KeepsFloat32, nn.Linear):
    """``W (g x) + b`` around an existing weight Parameter (no random numbers
    drawn). ``bias`` may be None (the paper's no-bias baseline, or a model
    that adds its bias elsewhere); ``gain_speed`` None means no gain (g = 1)."""

    float32_parameters = ("bias", "gain_param")

    def __init__(
        self,
        weight: nn.Parameter,
        bias: Optional[torch.Tensor] = None,
        gain_init: Optional[float] = None,
        gain_speed: Optional[float] = None,
    ):
        nn.Module.__init__(self)  # not nn.Linear's: it would draw a new W
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        if bias is not None:
            check_bias(bias, self.out_features)
            bias = bias.detach().to("cpu", torch.float32).clone()
        self.gain_speed = None if gain_speed is None else float(gain_speed)
        # Kept on the CPU for reset_parameters: a model built on the meta
        # device has no values until it is materialised.
        self.initial_values = {"bias": bias, "gain_param": None}
        self.bias = self._parameter(bias)
        if self.gain_speed is not None:
            u = head.initial_gain_param(gain_init, self.gain_speed)
            initial_gain = torch.full((1,), u, device="cpu")
            self.initial_values["gain_param"] = initial_gain
            self.gain_param = self._parameter(initial_gain)
        # Set on the meta device; a forward before reset_parameters is refused.
        self.awaiting_values = weight.device.type == "meta"

    def _parameter(self, values: Optional[torch.Tensor]) -> Optional[nn.Parameter]:
        if values is None:
            return None
        return nn.Parameter(values.to(self.weight.device, torch.float32, copy=True))

    def reset_parameters(self) -> None:
        """b and u to their initial values, shard by shard where they are
        sharded (every process calls it). W is not touched: it is the
        embedding's, or the model's own initialisation draws it."""
        for name, values in self.initial_values.items():
            if values is not None and getattr(self, name, None) is not None:
                fill_(getattr(self, name), values)
        self.awaiting_values = False

    def gain(self) -> Optional[torch.Tensor]:
        """g (:func:`natbias.head.gain`); None without a gain."""
        if self.gain_speed is None:
            return None
        return head.gain(self.gain_param, self.gain_speed)

    # True where the caller scales the features by g (:meth:`scale_by_gain`)
    # before they reach W: a fused-linear loss (natbias.olmo_core) reads W and
    # b, never this forward, so g must act on its input.
    input_scaled_by_caller = False

    def scale_by_gain(self, features: torch.Tensor) -> torch.Tensor:
        """g phi (phi itself without a gain): what W multiplies in eq. 1 with the gain."""
        gain = self.gain()
        if gain is None:
            return features
        gain = replicated_like(gain, features)  # one g, whole on every process
        return _ScaleByGain.apply(features, gain, self.gain_speed * self.in_features)

    def forward(self, features: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``rows`` (the features' leading shape): which row of a bias with one
        row per condition (a target language) each position adds."""
        if self.awaiting_values and self.weight.device.type != "meta":
            raise NaturalBiasError(
                "this model took the natural bias on the meta device and was materialised "
                "without initialising it: after to_empty, call model.init_weights() "
                "(transformers) or each module's reset_parameters()"
            )
        if not self.input_scaled_by_caller:
            features = self.scale_by_gain(features)
        bias = None if self.bias is None else self.bias.to(features.dtype)
        if bias is not None and head.per_language(bias):
            return F.linear(features, self.weight) + head.bias_rows(bias, rows)
        return F.linear(features, self.weight, bias)

    def _float32_device(self) -> torch.device:
        return self.weight.device

    def extra_repr(self) -> str:
        gain = "" if self.gain_speed is None else f", gain speed={self.gain_speed:g}"
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}{gain}"


def check_bias(values: torch.Tensor, vocab_size: int) -> None:
    """One bias, or one row per condition (a target language): ``(rows, |V|)``."""
    if values.dim() not in (1, 2) or values.shape[-1] != vocab_size:
        raise NaturalBiasError(
            f"the bias has {tuple(values.shape)} entries, the output layer "
            f"{vocab_size}: count with the model's own vocabulary"
        )


def paper_weight_init_(weight: torch.Tensor, reference_norm: float) -> None:
    """The paper's sec. 4.1 read literally: W element-wise from N(0, 1/sqrt(d))
    (variance 1/sqrt(d)), then rescaled so that ||W||_F is ``reference_norm``,
    the l2 norm of the log prior. Tied embeddings are rescaled with it."""
    if not reference_norm > 0:
        raise NaturalBiasError(
            "the paper's weight init rescales W to the norm of the log "
            "prior, which is 0 or unknown here"
        )
    with torch.no_grad():
        weight.normal_(mean=0.0, std=weight.shape[1] ** -0.25)
        weight.mul_(reference_norm / weight.norm())
