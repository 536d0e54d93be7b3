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
    fairseq's own W, and one learnt scalar gain g on the contextual logits,
    held between 0 and 1 (``--natbias-gain-form abs-capped``, the default)::

        logits = g * W phi + b,      g = min(|C * u|, 1)   (u the learnt parameter)

    g starts at ``--natbias-gain-init`` (0.05), so a fresh model predicts
    softmax(b), the unigram (Fig. 1 at update 0), and the speed C
    (``--natbias-gain-speed``, 20) makes Adam, whose steps on u are about one
    learning rate whatever the gradient's scale, move g about C learning
    rates per update: the contextual logits regrow within tens of updates
    instead of the hundreds ``damped`` needs, and, since the steps scale with
    the learning rate, a long warm-up stretches the rise with it. Once g
    reaches 1 its gradient is 0 and it stays there: the model is the paper's
    own, fairseq's ``W phi + b``. The cap is what 0.4.0 changed (issue 36):
    0.3's uncapped gain (``--natbias-gain-form linear``, g = C u) rose to
    1.5 by 1,000 updates and 2.0 by 20,000, a free inverse temperature that
    fit and overfit faster; on 3,000 training pairs it ended worse than stock
    fairseq, the capped gain better (docs/studies/small_corpora.md).
    0.6.0 takes the absolute value (``abs-capped``): 0.4.0's
    ``capped``, g = min(C u, 1), is the same while C u > 0, which held in
    every measured run but one: an English LM (seed 3) whose gain fell
    through 0 in its first 50 updates and ended at -1.23, 0.08 bits behind
    its other seeds at update 1,000; with the absolute value g turned back up
    and the run matched them (docs/weight_init.md).
    0.8.0 retires the gain's other forms and schedule for new models (see
    :data:`RETIRED`): 0.3's uncapped ``linear``, ``exp`` (g = exp(C u)) and
    the ``peak`` schedule (:class:`WarmupSpeedup`) led by a few updates at
    most, early on, and ended worse than the default when run to their best
    on a small corpus, so they remain only for the checkpoints that recorded
    them.
    Adam's steps on W and phi are not slowed by
    the small g (Adam divides the gradient by its own scale). g multiplies phi
    before the projection (W (g phi) + b), which costs a (tokens x d) product,
    not a (tokens x |V|) one.
``fairseq``
    fairseq's own init, untouched: N(0, d^-1/2) untied, the embedding when tied.
    The model is the stock transformer plus a bias. A fresh tied model predicts
    the unigram only roughly (10.7-11.0 bits against the unigram's 8.1 on
    Multi30k De-En): the decoder output still carries the input token.
``damped`` (retired for new models in 0.8.0)
    fairseq's own W with the gain of the layer norm that produces phi started
    at 0.1: it started at the unigram but learnt slower than ``gain`` and
    ``fairseq`` (v0.1.0's study). A checkpoint that recorded it holds
    ordinary parameters, so it loads, resumes and generates without any code
    of its own.
``paper``
    the paper's sec. 4.1 read literally: W element-wise from N(0, 1/sqrt(d))
    (variance 1/sqrt(d)), then rescaled so that ||W||_F equals the l2 norm of
    the target log-unigram. With tied embeddings this rescales the shared
    embedding matrix too. The reference norm is the log-unigram's also for
    ``zero`` and ``none`` (their own bias norm is 0 or absent).
"""

import logging
import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

# Every weight init, gain form and schedule a checkpoint may hold; a new
# model may start only with those not in RETIRED.
WEIGHT_INITS = ("gain", "fairseq", "damped", "paper")
DEFAULT_WEIGHT_INIT = "gain"
DEFAULT_GAIN_INIT = 0.05
# "capped" is "linear" held at or below 1: g = min(C u, 1) (issue 36, 0.4.0's
# default); "abs-capped" is min(|C u|, 1), the same wherever C u stays positive,
# and kept positive where the learnt C u would cross zero (0.6.0's default: on
# one English-LM seed of three the capped gain fell through 0 to -1.23 and
# lost most of its head start; docs/weight_init.md).
GAIN_FORMS = ("abs-capped", "capped", "exp", "linear")
CAPPED_FORMS = ("abs-capped", "capped")


class Retired(NamedTuple):
    """A setting a checkpoint may hold but a new model may not start with:
    what replaces it, the version that retired it, and why."""

    replacement: str
    version: str
    reason: str


# Retired settings, by option (its argparse dest) and value. Each measured no
# better than the default at the end of training anywhere it was run, so it is
# kept only to load, resume, fine-tune and generate the checkpoints that
# recorded it (docs/weight_init.md#retired-settings).
RETIRED = {
    ("natbias_gain_form", "capped"): Retired(
        "abs-capped", "0.6.1",
        "it is abs-capped wherever the gain stays positive and measured no better anywhere"),
    ("natbias_gain_form", "linear"): Retired(
        "abs-capped", "0.8.0",
        "uncapped (0.3's default), it rose past 1 (to about 2.0) and ended 0.08-0.10 bits "
        "above the capped gain on 3,000 pairs, level with it on 29,000; it led only within "
        "the first 1,000 updates"),
    ("natbias_gain_form", "exp"): Retired(
        "abs-capped", "0.8.0",
        "uncapped like linear, it rose past 1 (to about 2.2) and ended 0.08-0.10 bits "
        "above the capped gain on 3,000 pairs; it led only within the first 1,000 updates"),
    ("natbias_gain_schedule", "peak"): Retired(
        "lr", "0.8.0",
        "measured with exp, the form it was made for, its lead of about 20 updates in the "
        "first 1,000 under a long warm-up did not last: it ended 0.08-0.09 bits above the "
        "default on 3,000 pairs"),
    ("natbias_weight_init", "damped"): Retired(
        "gain", "0.8.0",
        "it starts at the unigram as gain does but learnt slower than gain and fairseq "
        "for every bias (v0.1.0's study)"),
}
DEFAULT_GAIN_FORM = "abs-capped"
# The default speed C of each form (measured: docs/weight_init.md). exp's C
# moves log g, so it needs a larger C than linear's to regrow g from 0.05 as
# fast: under the paper's warm-up C = 50 reached stock's validation NLL 89
# updates later than C = 100 (711 against 622 of 1,000, seed 1); in the short
# schedule 50 and 100 were alike (683, 685) and 20 slower (728).
DEFAULT_GAIN_SPEEDS = {"abs-capped": 20.0, "capped": 20.0, "exp": 100.0, "linear": 20.0}
# The cap of the ``capped`` form: at g = 1 the logits are W phi + b, the
# paper's own model (fairseq's W with the natural bias).
GAIN_CAP = 1.0
DEFAULT_GAIN_SPEED = DEFAULT_GAIN_SPEEDS[DEFAULT_GAIN_FORM]
# How the gain's speed meets the learning-rate warm-up (--natbias-gain-schedule):
# "lr" moves g (or log g) about C learning rates per update, so the warm-up
# slows it as it slows every other parameter; "peak" moves it about C *peak*
# learning rates per update from the first update (see WarmupSpeedup).
GAIN_SCHEDULES = ("lr", "peak")
DEFAULT_GAIN_SCHEDULE = "lr"


class WarmupSpeedup:
    """m(t) = peak lr / lr(t) during a linear warm-up, 1 after it: the factor
    that lifts a step of lr(t) to one of the peak learning rate.

    lr(t) = init + t (peak - init) / W for t < W, the linear warm-up of every
    fairseq scheduler that has one. m is capped at W, its value where
    lr(t) = peak / W, so that a warm-up from 0 (lr(0) = 0, a step that moves
    nothing) does not divide by zero. fairseq's ``fixed`` scheduler warms up
    one update ahead ((t + 1) / W): m is then at most W/(W-1) too small.
    """

    def __init__(self, peak_lr: float, warmup_updates: int, warmup_init_lr: float = 0.0):
        self.peak_lr = float(peak_lr)
        self.warmup_updates = max(int(warmup_updates or 0), 0)
        self.warmup_init_lr = max(float(warmup_init_lr or 0.0), 0.0)

    # Where a scheduler starts its warm-up when --warmup-init-lr is left at
    # fairseq's "unset" (-1): cosine and step start from --min-lr; the others
    # (inverse_sqrt, reduce_lr_on_plateau, polynomial_decay, fixed) from 0.
    STARTS_FROM_MIN_LR = ("cosine", "step")

    @classmethod
    def from_args(cls, args) -> "WarmupSpeedup":
        """From fairseq's --lr and the warm-up as the scheduler names it:
        --warmup-updates and --warmup-init-lr, or tri_stage's --warmup-steps
        (or its --phase-ratio of --max-update) and --init-lr-scale. Without a
        warm-up (absent options, or 0 updates) m = 1 throughout."""
        lr = getattr(args, "lr", None) or [0.0]
        peak = float(lr[0] if isinstance(lr, (list, tuple)) else lr)
        scheduler = getattr(args, "lr_scheduler", None)
        if scheduler == "tri_stage":
            ratio = getattr(args, "phase_ratio", None)
            updates = (int(args.max_update * ratio[0]) if ratio is not None
                       else getattr(args, "warmup_steps", 0))
            return cls(peak, updates, getattr(args, "init_lr_scale", 0.01) * peak)
        start = getattr(args, "warmup_init_lr", 0.0)
        if start is None or start < 0:
            start = (getattr(args, "min_lr", 0.0) if scheduler in cls.STARTS_FROM_MIN_LR
                     else 0.0)
        return cls(peak, getattr(args, "warmup_updates", 0), start)

    def __call__(self, update: int) -> float:
        if update >= self.warmup_updates or self.peak_lr <= 0:
            return 1.0
        lr = self.warmup_init_lr + update * (self.peak_lr - self.warmup_init_lr) / self.warmup_updates
        return min(self.peak_lr / max(lr, 1e-30), float(self.warmup_updates))


class KeepsFloat32(nn.Module):
    """A module whose ``float32_parameters`` and ``float32_buffers`` stay
    float32 when the model is cast to half precision (``.half()``, bfloat16):
    they are taken out while ``fn`` casts the rest, then only moved to the
    device of :meth:`_float32_device` (casting them to half and back would
    lose their precision). Shared by the output projection and the bigram
    residual."""

    float32_parameters = ()
    float32_buffers = ()

    def _float32_device(self) -> torch.device:
        raise NotImplementedError

    def _apply(self, fn, *args, **kwargs):
        kept = {name: self._parameters.pop(name) for name in self.float32_parameters
                if self._parameters.get(name) is not None}
        buffers = {name: self._buffers.pop(name) for name in self.float32_buffers
                   if self._buffers.get(name) is not None}
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


class OutputProjection(KeepsFloat32, nn.Linear):
    """``W x + b``: fairseq's output projection with the natural bias b.

    Built around the decoder's existing weight Parameter, so tied embeddings
    stay tied and no random numbers are drawn. b (and the gain parameter of
    :class:`GainedLinear`) stay float32 when the model is cast to half
    precision (``_apply``): fairseq's ``--memory-efficient-fp16``/``-bf16``
    keep no float32 master copy, and a rare token's bias (|b| >= 8, where
    fp16's spacing is 0.0078 and bfloat16's 0.0625) could not move by Adam
    steps of one learning rate. Under plain ``--fp16`` it costs 2|V| bytes.
    The forward casts b to the features' dtype, so the logits are as before.
    """

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter]):
        nn.Module.__init__(self)  # not nn.Linear's: it would draw a new W
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        self.bias = bias

    float32_parameters = ("bias",)
    float32_buffers = ()

    def _bias_like(self, features: torch.Tensor) -> Optional[torch.Tensor]:
        return None if self.bias is None else self.bias.to(features.dtype)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.weight, self._bias_like(features))

    def _float32_device(self) -> torch.device:
        return self.weight.device


class _ScaleByGain(torch.autograd.Function):
    """``features * g`` whose backward reduces g's gradient in float32 and
    hands the optimiser that gradient divided by a constant (``grad_divisor``).

    Why: g's gradient is a sum over every target token and every feature (a
    (tokens x d) reduction, ~4e4 for 3.9k tokens at d 512 before fairseq
    divides by the sample size), where every other gradient sums over tokens
    only. Under ``--fp16`` (loss-scaled, gradients in half precision) that sum
    overflows 65,504 at the loss scale stock fairseq runs at; in float32 it
    cannot. Divided by C * d it is the mean of what d per-feature gains
    (like a layer norm's) would get, commensurate with the rest of the
    network, so ``grad_norm`` and ``--clip-norm`` measure and clip the network
    as in stock fairseq instead of a term ~50 times larger. Adam's update
    (like Adagrad's and Adafactor's) is invariant to a constant scale of a
    parameter's gradient, so g moves as with the true gradient (tested).
    """

    @staticmethod
    def forward(ctx, features, gain, grad_divisor: float):
        ctx.save_for_backward(features, gain)
        ctx.grad_divisor = grad_divisor
        return features * gain.to(features.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        features, gain = ctx.saved_tensors
        grad_features = grad_gain = None
        if ctx.needs_input_grad[0]:
            grad_features = grad_output * gain.to(grad_output.dtype)
        if ctx.needs_input_grad[1]:
            total = torch.dot(grad_output.reshape(-1).float(), features.reshape(-1).float())
            grad_gain = (total / ctx.grad_divisor).reshape(gain.shape).to(gain.dtype)
        return grad_features, grad_gain, None


class GainedLinear(OutputProjection):
    """``W (g x) + b``: the output projection with a learnt scalar gain g on
    its input (weight init ``gain``); g = min(|C u|, 1) (``abs-capped``, the
    default), g = min(C u, 1) (``capped``, 0.4.0's), g = C u (``linear``,
    0.3's default) or g = exp(C u) (``exp``, positive at any speed).

    u draws no random numbers: every other parameter is the one the stock
    model draws with the same seed. Its state keys are ``weight``, ``bias``
    (when there is one) and ``gain_param`` (u, float32 like b).

    With the ``peak`` schedule the exponent z (g = z, or g = exp(z)) is
    z = z_a + C m(t) (u - u_a), m(t) from :class:`WarmupSpeedup`: each update
    (``set_num_updates``) folds the step just taken into the anchors z_a and
    u_a, then takes the new m, so g is continuous while its speed changes. u's
    gradient is divided by m(t) as well (``_ScaleByGain``), so the gradient
    Adam sees keeps its scale over the warm-up (Adam's running averages would
    otherwise remember the early, m-times larger gradients and shrink the
    steps). The anchors and m are float32 buffers in the state dict, so a
    resumed or loaded model has the same g and the same next step.
    """

    float32_parameters = ("bias", "gain_param")
    float32_buffers = ("gain_exponent_anchor", "gain_param_anchor", "gain_speedup")

    def __init__(self, weight: nn.Parameter, bias: Optional[nn.Parameter],
                 gain_init: float, speed: float, form: str = DEFAULT_GAIN_FORM,
                 schedule: str = DEFAULT_GAIN_SCHEDULE,
                 warmup: Optional[WarmupSpeedup] = None):
        super().__init__(weight, bias)
        if form not in GAIN_FORMS:
            raise ValueError(f"--natbias-gain-form {form!r}: choose one of {', '.join(GAIN_FORMS)}")
        if schedule not in GAIN_SCHEDULES:
            raise ValueError(f"--natbias-gain-schedule {schedule!r}: choose one of "
                             f"{', '.join(GAIN_SCHEDULES)}")
        self.speed = float(speed)
        self.form = form
        self.schedule = schedule
        exponent = math.log(gain_init) if form == "exp" else float(gain_init)
        self.gain_param = nn.Parameter(
            torch.tensor(exponent / self.speed, dtype=torch.float32, device=weight.device)
        )
        if schedule == "peak":
            self.warmup = warmup or WarmupSpeedup(0.0, 0)
            float32 = dict(dtype=torch.float32, device=weight.device)
            self.register_buffer("gain_exponent_anchor", torch.tensor(exponent, **float32))
            self.register_buffer("gain_param_anchor", self.gain_param.detach().clone())
            self.register_buffer("gain_speedup", torch.tensor(self.warmup(0), **float32))

    def _exponent(self) -> torch.Tensor:
        """z: g itself (linear), g before its cap (capped forms) or log g (exp)."""
        if self.schedule == "lr":
            return self.gain_param * self.speed
        return (self.gain_exponent_anchor
                + self.speed * self.gain_speedup * (self.gain_param - self.gain_param_anchor))

    def gain(self) -> torch.Tensor:
        exponent = self._exponent()
        if self.form == "abs-capped":
            # min(|z|, 1): past the cap u's gradient is 0, so g stays at 1 and
            # the model is W phi + b from then on (unless weight decay pulls u
            # back). Where z would cross zero, early, while the contextual
            # logits are still noise, g turns back up instead of changing sign.
            return torch.clamp(exponent.abs(), max=GAIN_CAP)
        if self.form == "capped":  # min(z, 1), 0.4.0-0.5's default
            return torch.clamp(exponent, max=GAIN_CAP)
        return exponent if self.form == "linear" else torch.exp(exponent)

    def set_num_updates(self, num_updates: int) -> None:
        """Called by fairseq before every update (and on loading a
        checkpoint): fold the last step into the anchors, take m(t).
        Idempotent: a second call for the same update changes nothing."""
        if self.schedule != "peak":
            return
        with torch.no_grad():
            self.gain_exponent_anchor.copy_(self._exponent())
            self.gain_param_anchor.copy_(self.gain_param)
            self.gain_speedup.fill_(self.warmup(num_updates))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        divisor = self.speed * self.in_features
        if self.schedule == "peak":  # a tensor: no host sync on a GPU
            divisor = self.gain_speedup * divisor
        scaled = _ScaleByGain.apply(features, self.gain(), divisor)
        return F.linear(scaled, self.weight, self._bias_like(scaled))

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", gain={self.form}, speed={self.speed:g}"
                + (", schedule=peak" if self.schedule == "peak" else ""))


def add_output_gain(decoder, gain_init: float, speed: float,
                    form: str = DEFAULT_GAIN_FORM, schedule: str = DEFAULT_GAIN_SCHEDULE,
                    warmup: Optional[WarmupSpeedup] = None) -> GainedLinear:
    """Replace ``decoder.output_projection`` by a :class:`GainedLinear` that
    shares its weight and bias."""
    for name, value in (("--natbias-gain-init", gain_init), ("--natbias-gain-speed", speed)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    if form in CAPPED_FORMS and gain_init >= GAIN_CAP:
        raise ValueError(f"--natbias-gain-init {gain_init:g} with --natbias-gain-form {form}: "
                         f"the gain is capped at {GAIN_CAP:g}, so start it below (default "
                         f"{DEFAULT_GAIN_INIT:g}), or use --natbias-weight-init fairseq for g = 1")
    projection = decoder.output_projection
    gained = GainedLinear(projection.weight, projection.bias, gain_init, speed, form,
                          schedule, warmup)
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
    """Give ``decoder.output_projection`` a bias initialised to ``values``
    (float32 whatever the model's dtype: see :class:`OutputProjection`).

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
    bias = nn.Parameter(values.to(torch.float32).clone(), requires_grad=not freeze)
    decoder.output_projection = OutputProjection(projection.weight, bias)


def output_bias(decoder) -> Optional[torch.Tensor]:
    projection = getattr(decoder, "output_projection", None)
    return None if projection is None else projection.bias


def init_output_weights(decoder, scheme: str, reference_norm: Optional[float]) -> None:
    """W's init for a new model: ``paper`` rescales it; ``gain`` and
    ``fairseq`` keep fairseq's W (the gain itself is added by
    :func:`add_output_gain`, also when a checkpoint is loaded). A loaded model
    keeps the W it saved, so a retired init (``damped``) never comes here."""
    if scheme in ("fairseq", "gain"):
        return
    if scheme == "paper":
        _paper_init(decoder, reference_norm)
        return
    raise ValueError(
        f"--natbias-weight-init {scheme!r} for a new model: choose one of "
        f"{', '.join(init for init in WEIGHT_INITS if ('natbias_weight_init', init) not in RETIRED)}"
    )


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
