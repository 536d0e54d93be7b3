"""The natural bias on a fairseq decoder: what ``transformer_natbias`` and
``transformer_lm_natbias`` share.

Meister et al. (2023), sec. 2.2: the final layer's bias b, with

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)     (4)

starts as the log-unigram distribution of the target training data, so that
p_b is the unigram and the contextual part ``W phi`` is left to model the rest.

Bias modes (``--natbias-init``):

``unigram``  log p(v) of the smoothed target-side unigram of the training data
``zero``     b = 0 (the paper's baseline 0)
``none``     no bias (the paper's other baseline; fairseq's own default)
``file``     log-unigram of a counts file (``--natbias-counts``, App. A.7)

Weight inits (``--natbias-weight-init``): see :mod:`fairseq_natbias.output_projection`.

Counting happens once, when a model is built for training from scratch. A model
built to load a checkpoint (``fairseq-generate``, ``fairseq-eval-lm``,
resuming, ``--finetune-from-model``) gets placeholders that the checkpoint
overwrites, so it neither recounts nor needs the training data. Its natural-bias
settings are then the checkpoint's: see :func:`reconcile_with_checkpoint`.

A model class uses this module by inheriting :class:`NaturalBiasModel` before
its fairseq base class; what is counted follows the task
(:func:`fairseq_natbias.unigram.count_training_targets`).
"""

import argparse
import logging
import os
from typing import Optional

import torch

from fairseq_natbias import checkpoint_loading, output_projection, unigram
from fairseq_natbias.logging_hook import TARGET_MASK_KEY, BiasDivergenceHook

logger = logging.getLogger(__name__)

BIAS_INITS = ("unigram", "zero", "none", "file")

# Recorded in the model's saved config once the bias has been initialised from
# counts (and kept when resuming or fine-tuning): a model built from that
# config is being loaded, not trained afresh.
COUNTED_MARKER = "natbias_target_tokens"
# The natural-bias options the command line left at their defaults, recorded
# when fairseq first applies the architecture: on resume those follow the
# checkpoint, while an option given explicitly must agree with it.
DEFAULTED_RECORD = "natbias_defaulted"
# Settings that change what the saved parameters mean; a checkpoint is only
# loaded into a model built with the same ones.
STRUCTURAL = ("natbias_init", "natbias_weight_init", "natbias_gain_speed",
              "natbias_gain_form")
# What a checkpoint that predates a structural setting was trained with:
# 0.2.0's gain was linear in its parameter (g = C u), before the form could be
# chosen (today's default too, but a default may change; the record may not).
LEGACY_STRUCTURAL = {"natbias_gain_form": "linear"}
# Settings that only mean something with the gain.
GAIN_SETTINGS = ("natbias_gain_speed", "natbias_gain_form")

DEFAULTS = {
    "natbias_init": "unigram",
    "natbias_counts": None,
    "natbias_smoothing": 1.0,
    "natbias_freeze": False,
    "natbias_weight_init": output_projection.DEFAULT_WEIGHT_INIT,
    "natbias_gain_init": output_projection.DEFAULT_GAIN_INIT,
    "natbias_gain_speed": None,  # the form's default: output_projection.DEFAULT_GAIN_SPEEDS
    "natbias_gain_form": output_projection.DEFAULT_GAIN_FORM,
    "natbias_feature_gain": 0.1,
    "no_natbias_logging": False,
    "natbias_stats_interval": None,
}


class NaturalBiasError(ValueError):
    """A natural-bias setting that cannot work; the message names the fix."""


# --- options -------------------------------------------------------------------


def add_args(parser) -> None:
    # fairseq hands models its "Model-specific configuration" argument group;
    # nesting a group in it is deprecated (Python 3.11), so add to it directly.
    is_group = isinstance(parser, argparse._ArgumentGroup)
    group = parser if is_group else parser.add_argument_group("natural bias (fairseq_natbias)")
    group.add_argument("--natbias-init", choices=BIAS_INITS,
                       help="output bias init: unigram (default), zero, none, file")
    group.add_argument("--natbias-counts", metavar="PATH",
                       help="counts file for --natbias-init file "
                            "(make one with natbias-count)")
    group.add_argument("--natbias-smoothing", type=float, metavar="ALPHA",
                       help="add-alpha smoothing of the unigram counts (default 1.0)")
    group.add_argument("--natbias-freeze", action="store_true", default=None,
                       help="hold the output bias fixed during training")
    group.add_argument("--natbias-weight-init", choices=output_projection.WEIGHT_INITS,
                       help="output-layer init: gain (default: a learnt scalar gain "
                            "on W phi, starting small), fairseq (fairseq's own), "
                            "damped, paper; see docs/weight_init.md")
    group.add_argument("--natbias-gain-init", type=float, metavar="G0",
                       help="starting value of the gain g on W phi with "
                            "--natbias-weight-init gain (default 0.05)")
    group.add_argument("--natbias-gain-speed", type=float, metavar="C",
                       help="Adam moves g (form linear) or log g (form exp) about C "
                            "learning rates per update (default 20 for linear, 100 for exp)")
    group.add_argument("--natbias-gain-form", choices=output_projection.GAIN_FORMS,
                       help="g = C*u (linear, the default) or g = exp(C*u) (exp: "
                            "positive at any speed)")
    group.add_argument("--natbias-feature-gain", type=float, metavar="G",
                       help="initial gain of the norm producing phi with "
                            "--natbias-weight-init damped (default 0.1)")
    group.add_argument("--no-natbias-logging", action="store_true", default=None,
                       help="do not log bias_kl, bias_norm, gain, kl_unigram, kl_uniform")
    group.add_argument("--natbias-stats-interval", type=int, metavar="N",
                       help="compute kl_unigram/kl_uniform every N training "
                            "updates (default: --log-interval)")


def set_defaults(args) -> None:
    """Fill the options the command line left unset (None), and record which
    (the first time only: a config read back from a checkpoint keeps its record).
    A config read back from a checkpoint of an earlier version gets the
    structural settings that version had (:data:`LEGACY_STRUCTURAL`)."""
    if getattr(args, COUNTED_MARKER, None) is not None:
        with_legacy_settings(args)
    defaulted = [name for name in DEFAULTS if getattr(args, name, None) is None]
    if getattr(args, DEFAULTED_RECORD, None) is None:
        setattr(args, DEFAULTED_RECORD, defaulted)
    for name in defaulted:
        setattr(args, name, DEFAULTS[name])
    if args.natbias_gain_speed is None:
        args.natbias_gain_speed = output_projection.DEFAULT_GAIN_SPEEDS[args.natbias_gain_form]


def with_legacy_settings(settings):
    """Fill in, on a saved config, the structural settings its version did
    not record; returns it."""
    if getattr(settings, "natbias_init", None) is not None:
        for name, value in LEGACY_STRUCTURAL.items():
            if getattr(settings, name, None) is None:
                setattr(settings, name, value)
    return settings


def check_args(args) -> None:
    if getattr(args, "adaptive_softmax_cutoff", None):
        raise NaturalBiasError(
            "the natural bias does not support --adaptive-softmax-cutoff: it is "
            "one vector over the whole target vocabulary, which an adaptive "
            "softmax splits into clusters. Drop the option."
        )
    if (getattr(args, "quant_noise_scalar", 0) or 0) > 0:
        raise NaturalBiasError(
            "the natural bias does not support --quant-noise-scalar: fairseq's "
            "scalar quantizer swaps the output projection for its own IntLinear, "
            "which has no gain and no float32 bias. Drop the option."
        )
    unigram.check_smoothing(args.natbias_smoothing)
    if args.natbias_init == "file" and not args.natbias_counts:
        raise NaturalBiasError(
            "--natbias-init file needs --natbias-counts PATH (a counts file made "
            "with `natbias-count --dict DATA/dict.TGT.txt --text CORPUS.tok`)"
        )
    if args.natbias_counts and args.natbias_init != "file":
        raise NaturalBiasError(
            f"--natbias-counts is only read with --natbias-init file, not "
            f"--natbias-init {args.natbias_init}"
        )


def options_text(settings, names=STRUCTURAL) -> str:
    """``--natbias-init unigram --natbias-weight-init gain ...``: the named
    settings of a config as command-line options (the gain's speed and form
    only with the ``gain`` init, where they mean something)."""
    parts = []
    for name in names:
        value = getattr(settings, name, None)
        if value is None or (name in GAIN_SETTINGS
                             and getattr(settings, "natbias_weight_init", None) != "gain"):
            continue
        parts.append(f"--{name.replace('_', '-')} {value:g}" if isinstance(value, float)
                     else f"--{name.replace('_', '-')} {value}")
    return " ".join(parts)


# --- checkpoints -----------------------------------------------------------------


def checkpoint_to_load(args):
    """``(kind, path)`` when the parameters built now will be overwritten from
    a checkpoint, else None. ``kind``: ``config`` (the config itself came from
    a checkpoint: generation, eval-lm), ``resume`` or ``finetune``, by
    fairseq's own restore rules (``checkpoint_utils.load_checkpoint``):
    checkpoint_last in --save-dir wins; on a first launch --continue-once,
    then --finetune-from-model; a non-default --restore-file has the
    --checkpoint-suffix put before its ``.pt``. A checkpoint loaded with a
    --reset-* flag is fine-tuned, otherwise resumed."""
    if getattr(args, COUNTED_MARKER, None) is not None:
        return "config", None
    save_dir = getattr(args, "save_dir", "checkpoints")
    restore_file = getattr(args, "restore_file", "checkpoint_last.pt")
    suffix = getattr(args, "checkpoint_suffix", "") or ""
    resets = ("reset_optimizer", "reset_lr_scheduler", "reset_meters", "reset_dataloader")
    kind = "finetune" if any(getattr(args, r, False) for r in resets) else "resume"
    if restore_file == "checkpoint_last.pt":
        last = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        if os.path.exists(last):
            return kind, last
        continue_once = getattr(args, "continue_once", None)
        if continue_once is not None:  # fairseq loads it, or fails saying it is missing
            return (kind, continue_once) if os.path.exists(continue_once) else None
        finetune = getattr(args, "finetune_from_model", None)
        if finetune and os.path.exists(finetune):
            return "finetune", finetune
        return None
    restore_file = restore_file.replace(".pt", suffix + ".pt")
    return (kind, restore_file) if os.path.exists(restore_file) else None


def saved_model_args(path: str):
    """The model config a fairseq checkpoint was trained with (None if the
    file holds none), read by :mod:`fairseq_natbias.checkpoint_loading`; a
    file that is no checkpoint is a :class:`NaturalBiasError` naming the fix."""
    try:
        return checkpoint_loading.saved_model_args(path)
    except checkpoint_loading.CheckpointError as error:
        raise NaturalBiasError(str(error)) from None


def reconcile_with_checkpoint(args, kind: str, path: str) -> None:
    """Build the model with the natural-bias settings of the checkpoint it
    will load, so its parameters mean what they meant when saved.

    Resuming: an option left at its default follows the checkpoint (so runs
    started with an earlier default resume unchanged); one given explicitly
    and different is refused, naming both and the fix. Fine-tuning: the
    checkpoint's settings are taken and the log says what becomes of the bias.
    """
    saved = saved_model_args(path)
    if saved is not None:
        saved = with_legacy_settings(saved)
    if saved is None or getattr(saved, "natbias_init", None) is None:
        arch = getattr(saved, "arch", "unknown")
        raise NaturalBiasError(
            f"{path} was not trained with the natural bias (--arch {arch}); "
            f"{'resume it with --arch ' + arch if kind == 'resume' else 'fine-tune it with its own --arch'}, "
            "or train a natbias model from scratch in a new --save-dir."
        )
    explicit = [name for name in STRUCTURAL
                if name not in (getattr(args, DEFAULTED_RECORD, None) or ())]
    differing = [name for name in STRUCTURAL if _differs(args, saved, name)]
    if kind == "resume":
        refused = [name for name in differing if name in explicit]
        if refused:
            raise NaturalBiasError(
                f"{path} was trained with {options_text(saved)}; the command line "
                f"asks for {options_text(args, refused)}. Resuming would continue "
                f"the checkpoint's model, not the one asked for. Give a new "
                f"--save-dir to train {options_text(args, refused)} from scratch, or "
                f"drop those options (or give the checkpoint's) to resume."
            )
    for name in differing:
        setattr(args, name, getattr(saved, name))
    if kind == "finetune":
        ignored = [name for name in differing if name in explicit]
        logger.warning(
            "natbias: fine-tuning from %s: its output bias%s and W are loaded as "
            "trained (%s), not re-initialised or recounted%s",
            path, ", gain" if args.natbias_weight_init == "gain" else "",
            options_text(saved),
            "; " + ", ".join("--" + n.replace("_", "-") for n in ignored)
            + " on the command line ignored" if ignored else "",
        )
    elif differing:
        logger.info("natbias: resuming %s with its own %s", path, options_text(saved))
    setattr(args, COUNTED_MARKER, int(getattr(saved, COUNTED_MARKER, None) or 0))


def _differs(args, saved, name) -> bool:
    if name in GAIN_SETTINGS and getattr(saved, "natbias_weight_init", None) != "gain":
        return False  # no gain in the checkpoint: its speed and form mean nothing
    value = getattr(saved, name, None)
    return value is not None and value != getattr(args, name)


# --- the model -----------------------------------------------------------------


class NaturalBiasModel:
    """Mixin for a fairseq model with a ``decoder`` whose output projection
    gets the natural bias. The model class inherits it before its fairseq base
    and calls :meth:`_mark_targets` at the end of its ``forward``."""

    @classmethod
    def build_model(cls, args, task):
        set_defaults(args)
        try:
            check_args(args)
            loading = checkpoint_to_load(args)
            if loading is not None and loading[0] != "config":
                reconcile_with_checkpoint(args, *loading)
            model = super().build_model(args, task)
            model._init_natbias(args, task, loading is not None)
        except (unigram.UnigramError, ValueError) as error:
            # A clear one-line message from fairseq-train, not a traceback.
            raise SystemExit(f"fairseq_natbias: error: {error}") from error
        return model

    def _init_natbias(self, args, task, weights_will_be_loaded: bool) -> None:
        decoder = self.decoder
        vocab_size = decoder.output_projection.out_features
        if weights_will_be_loaded:  # placeholders the checkpoint overwrites
            log_unigram = torch.zeros(vocab_size)
            bias = None if args.natbias_init == "none" else torch.zeros(vocab_size)
        else:
            log_unigram, bias = self._count_and_initialise(args, task)
        output_projection.attach_output_bias(decoder, bias, freeze=args.natbias_freeze)
        if args.natbias_weight_init == "gain":
            output_projection.add_output_gain(decoder, args.natbias_gain_init,
                                              args.natbias_gain_speed, args.natbias_gain_form)
        self.register_buffer("target_log_unigram", log_unigram)
        self.natbias_args = args  # read by _controlled_logits (--model-overrides)
        self.natbias_hook = None
        if not args.no_natbias_logging:
            interval = args.natbias_stats_interval or getattr(args, "log_interval", 100)
            self.natbias_hook = BiasDivergenceHook(self, interval)
            self.natbias_hook.attach(task)

    def _count_and_initialise(self, args, task):
        """Count the target training unigram, initialise W, and return the
        log-unigram and the initial bias (None for ``none``)."""
        counts = unigram.count_training_targets(task, getattr(args, "train_subset", "train"))
        log_unigram = unigram.unigram_log_probs(counts, args.natbias_smoothing)
        bias = _initial_bias(args, task, log_unigram)
        # W's reference norm is the log-unigram's also for zero / none, so that
        # the three runs share W and differ in the bias alone.
        reference = log_unigram if bias is None or args.natbias_init == "zero" else bias
        output_projection.init_output_weights(
            self.decoder, args.natbias_weight_init, reference.norm().item(),
            args.natbias_feature_gain,
        )
        setattr(args, COUNTED_MARKER, int(counts.sum()))
        return log_unigram, bias

    def _apply(self, fn, *args, **kwargs):
        """Keep ``target_log_unigram`` in float32 whatever the model is cast to
        (fairseq's --fp16 calls ``.half()``, --bf16 ``.to(torch.bfloat16)``): it
        is a statistic read by the logging hook, the logit adjustment and the
        analysis tools, and bfloat16 would round the log-probability of a rare
        token (~ -17 nats) to the nearest 0.125. The bias and the gain
        parameter stay float32 too (:class:`output_projection.OutputProjection`)."""
        # Taken out while fn casts the rest, then moved to the parameters'
        # device only: casting it to half and back would lose the precision.
        log_unigram = self._buffers.pop("target_log_unigram", None)
        try:
            module = super()._apply(fn, *args, **kwargs)
        finally:
            if log_unigram is not None:
                device = next(self.parameters()).device
                self._buffers["target_log_unigram"] = log_unigram.to(device, torch.float32)
        return module

    def _mark_targets(self, net_output, target_tokens):
        """Tell the logging hook which positions are real targets: those where
        ``target_tokens`` (aligned with the targets, padded alike) is not pad."""
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and hook.armed:
            net_output[1][TARGET_MASK_KEY] = target_tokens.ne(self.decoder.padding_idx)
        return net_output

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        net_output = self._controlled_logits(net_output)
        probs = super().get_normalized_probs(net_output, log_probs, sample)
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and log_probs:
            hook.observe(probs, net_output)
        return probs

    def _controlled_logits(self, net_output):
        """Generation-time control of the frequency bias (set only through
        ``--model-overrides``; see fairseq_natbias/analysis/sweep.py):
        logits ``g W phi + b`` become ``g W phi + lambda b - tau log unigram``
        (Kobayashi et al.'s lambda; logit adjustment tau).

        Refused in training mode: fairseq-train has no such options, and a
        model trained with them would save them in its checkpoint."""
        scale = getattr(self.natbias_args, "natbias_bias_scale", None)
        adjust = getattr(self.natbias_args, "natbias_logit_adjustment", None)
        scale = 1.0 if scale is None else float(scale)
        adjust = 0.0 if adjust is None else float(adjust)
        if scale == 1.0 and adjust == 0.0:
            return net_output
        if self.training:
            raise ValueError(
                f"natbias_bias_scale={scale:g} / natbias_logit_adjustment={adjust:g} "
                "are generation-time settings (--model-overrides); they are refused "
                "in training, where a saved checkpoint would keep them"
            )
        logits = net_output[0]
        bias = self.decoder.output_projection.bias
        if bias is not None and scale != 1.0:
            logits = logits + (scale - 1.0) * bias.to(logits.dtype)
        if adjust != 0.0:
            logits = logits - adjust * self.target_log_unigram.to(logits.dtype)
        return (logits, *net_output[1:])


def _initial_bias(args, task, log_unigram) -> Optional[torch.Tensor]:
    if args.natbias_init == "unigram":
        return log_unigram.clone()
    if args.natbias_init == "zero":
        return torch.zeros_like(log_unigram)
    if args.natbias_init == "file":
        counts = unigram.read_counts_file(args.natbias_counts, task.target_dictionary)
        return unigram.unigram_log_probs(counts, args.natbias_smoothing)
    return None
