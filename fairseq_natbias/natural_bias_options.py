"""The natural bias's command-line options (``--natbias-*``), their defaults,
their checks, and which of them are structural (change what the saved
parameters mean). Added by both natbias architectures to fairseq's
"Model-specific configuration"; documented in docs/options.md.

Where the rest is: the model mixin that acts on them in
:mod:`fairseq_natbias.natural_bias`, their reconciliation with a checkpoint
in :mod:`fairseq_natbias.checkpoint_settings`.
"""

import argparse

from fairseq_natbias import output_projection, unigram

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
              "natbias_gain_form", "natbias_gain_schedule", "natbias_order")
# What a checkpoint that predates a structural setting was trained with:
# 0.2.0's gain was linear in its parameter (g = C u), before the form could be
# chosen (0.3's default; 0.4.0's is capped, 0.6.0's abs-capped, and the
# record keeps 0.2.0's).
# 0.3.2's and earlier gains moved with the learning rate (schedule lr).
# Before 0.5.0 every model was of order 1 (the unigram bias alone).
LEGACY_STRUCTURAL = {"natbias_gain_form": "linear", "natbias_gain_schedule": "lr",
                     "natbias_order": 1}
# --natbias-order: 1, the unigram bias; 2 adds the fixed bigram residual
# (fairseq_natbias.bigram_residual), an experiment (docs/studies/bigram.md).
ORDERS = (1, 2)
# Settings that only mean something with the gain.
GAIN_SETTINGS = ("natbias_gain_speed", "natbias_gain_form", "natbias_gain_schedule")

DEFAULTS = {
    "natbias_init": "unigram",
    "natbias_order": 1,
    "natbias_counts": None,
    "natbias_smoothing": 1.0,
    "natbias_freeze": False,
    "natbias_weight_init": output_projection.DEFAULT_WEIGHT_INIT,
    "natbias_gain_init": output_projection.DEFAULT_GAIN_INIT,
    "natbias_gain_speed": None,  # the form's default: output_projection.DEFAULT_GAIN_SPEEDS
    "natbias_gain_form": output_projection.DEFAULT_GAIN_FORM,
    "natbias_gain_schedule": output_projection.DEFAULT_GAIN_SCHEDULE,
    "natbias_feature_gain": 0.1,
    "no_natbias_logging": False,
    "natbias_stats_interval": None,
}


class NaturalBiasError(ValueError):
    """A natural-bias setting that cannot work; the message names the fix."""



def add_args(parser) -> None:
    # fairseq hands models its "Model-specific configuration" argument group;
    # nesting a group in it is deprecated (Python 3.11), so add to it directly.
    is_group = isinstance(parser, argparse._ArgumentGroup)
    group = parser if is_group else parser.add_argument_group("natural bias (fairseq_natbias)")
    group.add_argument("--natbias-init", choices=BIAS_INITS,
                       help="output bias init: unigram (default), zero, none, file")
    group.add_argument("--natbias-order", type=int, choices=ORDERS,
                       help="1 (default): the unigram bias; 2 (experimental): adds "
                            "beta*D[previous token], a fixed Witten-Bell bigram residual "
                            "counted from the training targets, trained leave-one-out; "
                            "measured better than 1 for a language model's first 1,000 "
                            "updates, at the end of training only for a small English "
                            "one, worse in translation (docs/studies/bigram.md)")
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
                            "paper; damped (retired in 0.8.0) only resumes its "
                            "checkpoints; see docs/weight_init.md")
    group.add_argument("--natbias-gain-init", type=float, metavar="G0",
                       help="starting value of the gain g on W phi with "
                            "--natbias-weight-init gain (default 0.05)")
    group.add_argument("--natbias-gain-speed", type=float, metavar="C",
                       help="Adam moves g about C learning rates per update (default 20)")
    group.add_argument("--natbias-gain-form", choices=output_projection.GAIN_FORMS,
                       help="g = min(|C*u|, 1) (abs-capped, the default and the one "
                            "form for new models: past 1 the model is fairseq's "
                            "W phi + b); capped, exp and linear (retired) only resume "
                            "and fine-tune the checkpoints that recorded them")
    group.add_argument("--natbias-gain-schedule", choices=output_projection.GAIN_SCHEDULES,
                       help="lr (default, the one schedule for new models): g moves "
                            "about C learning rates per update, slowed by the warm-up "
                            "like every parameter; peak (retired in 0.8.0) only resumes "
                            "its checkpoints (docs/weight_init.md)")
    group.add_argument("--natbias-feature-gain", type=float, metavar="G",
                       help="damped's layer-norm gain (retired with damped in 0.8.0: "
                            "accepted so that a damped run's command line still "
                            "resumes; it changes nothing)")
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
    if args.natbias_order == 2 and args.natbias_init != "unigram":
        raise NaturalBiasError(
            f"--natbias-order 2 with --natbias-init {args.natbias_init}: the bigram "
            "residual is relative to the unigram the bias starts from (b = log p), "
            "counted on the same training targets. Use --natbias-init unigram, or "
            "--natbias-order 1."
        )
    if args.natbias_counts and args.natbias_init != "file":
        raise NaturalBiasError(
            f"--natbias-counts is only read with --natbias-init file, not "
            f"--natbias-init {args.natbias_init}"
        )


def check_new_model(args) -> None:
    """What only a model trained from scratch (not loaded from a checkpoint)
    must satisfy: no retired setting (:data:`output_projection.RETIRED`; the
    gain's form and schedule only count with the gain)."""
    for name in ("natbias_weight_init", *GAIN_SETTINGS):
        if name in GAIN_SETTINGS and args.natbias_weight_init != "gain":
            continue
        value = getattr(args, name, None)
        retired = output_projection.RETIRED.get((name, value))
        if retired is None:
            continue
        option = "--" + name.replace("_", "-")
        raise NaturalBiasError(
            f"{option} {value} is retired for new models ({retired.version}): "
            f"{retired.reason} (docs/weight_init.md#retired-settings). Use {option} "
            f"{retired.replacement} (the default); checkpoints trained with {value} "
            f"still resume, fine-tune and generate with it."
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
