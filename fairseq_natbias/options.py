"""The natural bias's options (``--natbias-*``), their defaults and checks,
shared by both architectures (docs/options.md)."""

import argparse

from natbias import FORMAT_VERSION
from natbias.errors import NaturalBiasError
from natbias.head import DEFAULT_GAIN_INIT, DEFAULT_GAIN_SPEED, check_gain
from natbias.metrics import METRICS, per_token
from natbias.prior import DEFAULT_SMOOTHING, check_smoothing

BIAS_INITS = ("unigram", "zero", "none", "file")
WEIGHT_INITS = ("gain", "fairseq", "paper")
ORDERS = (1, 2)
PRIORS = ("pooled", "per-language")

# Recorded in the saved config once the bias has been counted: a model built
# from that config is being loaded, not trained afresh.
COUNTED_MARKER = "natbias_target_tokens"
# Recorded with it: the token that selects each per-language row (row k: the k-th).
LANGUAGE_TOKENS = "natbias_language_tokens"
# The format of what a checkpoint records (natbias.FORMAT_VERSION).
FORMAT_KEY = "natbias_format_version"
# The options the command line left at their defaults, recorded when fairseq
# first applies the architecture: on resume they follow the checkpoint, while
# an option given explicitly must agree with it.
DEFAULTED_RECORD = "natbias_defaulted"
# Settings that change what the saved parameters mean: a checkpoint is only
# loaded into a model built with the same ones.
STRUCTURAL = (
    "natbias_init",
    "natbias_weight_init",
    "natbias_gain_speed",
    "natbias_order",
    "natbias_prior",
)

DEFAULTS = {
    "natbias_init": "unigram",
    "natbias_order": 1,
    "natbias_prior": "per-language",
    "natbias_counts": None,
    "natbias_smoothing": DEFAULT_SMOOTHING,
    "natbias_freeze": False,
    "natbias_weight_init": "gain",
    "natbias_gain_init": DEFAULT_GAIN_INIT,
    "natbias_gain_speed": DEFAULT_GAIN_SPEED,
    "no_natbias_logging": False,
    "natbias_stats_interval": None,
}


def add_args(parser) -> None:
    # fairseq hands models its "Model-specific configuration" group; nesting a
    # group in it is deprecated (Python 3.11), so add to it directly.
    group = parser
    if not isinstance(parser, argparse._ArgumentGroup):
        group = parser.add_argument_group("natural bias (fairseq_natbias)")
    add = group.add_argument
    add(
        "--natbias-init",
        choices=BIAS_INITS,
        help="output bias: unigram (default: the log-unigram of the training targets), "
        "zero, none (the paper's baselines), file (from --natbias-counts)",
    )
    add(
        "--natbias-order",
        type=int,
        choices=ORDERS,
        help="1 (default): the unigram bias; 2 (experimental): plus a fixed bigram residual",
    )
    add(
        "--natbias-prior",
        choices=PRIORS,
        help="per-language (default where the decoder is told its target language): one bias "
        "row per target language, chosen by its language token; pooled: one prior for all",
    )
    add(
        "--natbias-counts",
        metavar="PATH",
        help="counts file for --natbias-init file (natbias-count makes one)",
    )
    add(
        "--natbias-smoothing",
        type=float,
        metavar="ALPHA",
        help=f"add-alpha smoothing of the unigram counts (default {DEFAULT_SMOOTHING:g}), "
        "for the model and the criteria alike",
    )
    add(
        "--natbias-freeze",
        action="store_true",
        default=None,
        help="hold the output bias fixed during training",
    )
    add(
        "--natbias-weight-init",
        choices=WEIGHT_INITS,
        help="gain (default: a learnt gain on W phi, starting at --natbias-gain-init), "
        "fairseq (fairseq's own W), paper (the paper's sec. 4.1)",
    )
    add(
        "--natbias-gain-init",
        type=float,
        metavar="G0",
        help=f"start of g (default {DEFAULT_GAIN_INIT})",
    )
    add(
        "--natbias-gain-speed",
        type=float,
        metavar="C",
        help=f"the gain moves about C learning rates per update (default {DEFAULT_GAIN_SPEED:g})",
    )
    add(
        "--no-natbias-logging",
        action="store_true",
        default=None,
        help="do not log " + ", ".join(METRICS),
    )
    add(
        "--natbias-stats-interval",
        type=int,
        metavar="N",
        help=f"compute {' and '.join(per_token())} every N updates (default: --log-interval)",
    )


def set_defaults(args) -> None:
    """Fill the options the command line left unset, and record which (the
    first time only: a config read back from a checkpoint keeps its record),
    and the format version of a new model."""
    defaulted = [name for name in DEFAULTS if getattr(args, name, None) is None]
    if getattr(args, DEFAULTED_RECORD, None) is None:
        setattr(args, DEFAULTED_RECORD, defaulted)
    for name in defaulted:
        setattr(args, name, DEFAULTS[name])
    # A config read back from a checkpoint keeps the format it recorded.
    if getattr(args, FORMAT_KEY, None) is None and getattr(args, COUNTED_MARKER, None) is None:
        setattr(args, FORMAT_KEY, FORMAT_VERSION)


def check_args(args, splitting) -> None:
    """Refuse what the bias cannot be built with (``splitting``: options that split |V|)."""
    for split in splitting:
        if getattr(args, split, None):
            raise NaturalBiasError(
                "the natural bias is one vector over the whole vocabulary (and an embedding "
                f"tied to it one matrix), which --{split.replace('_', '-')} splits: drop it"
            )
    if (getattr(args, "quant_noise_scalar", 0) or 0) > 0:
        raise NaturalBiasError(
            "--quant-noise-scalar swaps the output layer for fairseq's "
            "IntLinear, which has no natural bias: drop the option"
        )
    check_smoothing(args.natbias_smoothing)
    if args.natbias_weight_init == "gain":
        check_gain(args.natbias_gain_init, args.natbias_gain_speed)
    if args.natbias_init == "file" and not args.natbias_counts:
        raise NaturalBiasError(
            "--natbias-init file needs --natbias-counts PATH (make one with "
            "`natbias-count --dict DATA/dict.TGT.txt --text CORPUS.tok`)"
        )
    if args.natbias_counts and args.natbias_init != "file":
        raise NaturalBiasError(
            f"--natbias-counts is read with --natbias-init file only, not "
            f"--natbias-init {args.natbias_init}"
        )
    if args.natbias_order == 2 and args.natbias_init != "unigram":
        raise NaturalBiasError(
            f"--natbias-order 2 with --natbias-init {args.natbias_init}: the "
            "bigram residual is relative to the unigram bias; use "
            "--natbias-init unigram, or --natbias-order 1"
        )


def options_text(settings, names=STRUCTURAL) -> str:
    """``--natbias-init unigram --natbias-weight-init gain ...``: the named
    settings of a config as options (the gain's speed only with the gain)."""
    parts = []
    for name in names:
        value = getattr(settings, name, None)
        if value is None or (
            name == "natbias_gain_speed"
            and getattr(settings, "natbias_weight_init", None) != "gain"
        ):
            continue
        shown = f"{value:g}" if isinstance(value, float) else value
        parts.append(f"--{name.replace('_', '-')} {shown}")
    return " ".join(parts)
