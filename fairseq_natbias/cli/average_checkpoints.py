"""natbias-average-checkpoints: average the parameters of fairseq checkpoints
(the command line of fairseq's scripts/average_checkpoints.py, which fairseq's
wheels do not ship)::

    natbias-average-checkpoints --inputs ckpt/checkpoint_1_2000.pt ckpt/checkpoint_2_4000.pt \\
        --output ckpt/averaged.pt
    natbias-average-checkpoints --inputs ckpt --num-update-checkpoints 5 --output ckpt/avg5.pt

Checkpoints of different architectures, vocabularies or natural-bias settings
are refused. Each floating-point tensor becomes the mean over the inputs
(in float64, stored in its own dtype); any other tensor must be equal in every
input; everything else (configuration, optimizer state) is the first input's.
"""

import os
import re
import sys

from natbias.errors import NaturalBiasError

PROG = "natbias-average-checkpoints"
# The files --num-epoch-checkpoints and --num-update-checkpoints average.
NUMBERED = {"epoch": "checkpoint<epoch>.pt", "update": "checkpoint_<epoch>_<update>.pt"}


class AverageError(NaturalBiasError):
    """Inputs that cannot be averaged; the message names the fix."""


def build_parser():
    from natbias.tools.cli import parser_for

    parser = parser_for(PROG, __doc__)
    parser.add_argument(
        "--inputs",
        required=True,
        nargs="+",
        metavar="PATH",
        help="checkpoint files; or one folder with --num-*-checkpoints",
    )
    parser.add_argument(
        "--output", required=True, metavar="FILE", help="where the averaged checkpoint is written"
    )
    count = parser.add_mutually_exclusive_group()
    for kind, files in NUMBERED.items():
        text = f"average the last N {files} of the folder --inputs"
        count.add_argument(f"--num-{kind}-checkpoints", type=int, metavar="N", help=text)
    parser.add_argument(
        "--checkpoint-upper-bound",
        type=int,
        metavar="K",
        help="with --num-*-checkpoints: only epochs (updates) up to K",
    )
    return parser


def last_checkpoints(folder, n, by_update, upper_bound=None):
    """The newest ``n`` epoch (or update) checkpoints in ``folder``, newest first."""
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt" if by_update else r"checkpoint(\d+)\.pt")
    kind = NUMBERED["update" if by_update else "epoch"]
    if not os.path.isdir(folder):
        raise AverageError(
            f"{folder} is not a folder: with --num-"
            f"{'update' if by_update else 'epoch'}-checkpoints give "
            "--inputs the save dir holding the checkpoints"
        )
    numbered = [(int(m[1]), m[0]) for m in map(pattern.fullmatch, os.listdir(folder)) if m]
    found = [(k, name) for k, name in numbered if upper_bound is None or k <= upper_bound]
    if len(found) < n:
        raise AverageError(
            f"{folder} holds {len(found)} {kind} files{' up to ' + str(upper_bound) if upper_bound is not None else ''}, "
            f"fewer than the {n} asked for: ask for fewer, or train with "
            f"{'--save-interval-updates' if by_update else 'epoch checkpoints (no --no-epoch-checkpoints)'}"
        )
    return [os.path.join(folder, name) for _, name in sorted(found, reverse=True)[:n]]


def input_paths(args):
    count = args.num_update_checkpoints or args.num_epoch_checkpoints
    if args.checkpoint_upper_bound is not None and not count:
        raise AverageError(
            "--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints"
        )
    if count:
        if len(args.inputs) != 1:
            raise AverageError("with --num-*-checkpoints give --inputs one folder (the save dir)")
        return last_checkpoints(
            args.inputs[0], count, bool(args.num_update_checkpoints), args.checkpoint_upper_bound
        )
    for path in args.inputs:
        if os.path.isdir(path):
            raise AverageError(
                f"{path} is a folder: give checkpoint files, or the folder "
                "with --num-epoch-checkpoints N / --num-update-checkpoints N"
            )
    if len(args.inputs) < 2:
        raise AverageError("one checkpoint is nothing to average: give two or more")
    return list(args.inputs)


def settings(path):
    """What an input's parameters mean: (arch, natural-bias settings as options text)."""
    from fairseq_natbias.checkpoints import saved_model_args
    from fairseq_natbias.options import STRUCTURAL, options_text

    saved = saved_model_args(path)  # a CheckpointError (missing, no checkpoint) names the fix
    if saved is None:
        raise AverageError(
            f"{path} holds no training configuration: give checkpoint_*.pt "
            "files written by fairseq-train"
        )
    natbias = options_text(saved, STRUCTURAL) if getattr(saved, "natbias_init", None) else ""
    return getattr(saved, "arch", None), natbias


def check_same_settings(paths):
    first_arch, first_natbias = settings(paths[0])
    for path in paths[1:]:
        arch, natbias = settings(path)
        if arch != first_arch:
            raise AverageError(
                f"{paths[0]} is --arch {first_arch}, {path} is --arch {arch}: average only "
                "checkpoints of one model (e.g. of one training run)"
            )
        if natbias != first_natbias:
            raise AverageError(
                f"{paths[0]} was trained with {first_natbias or 'no natural bias'}, {path} with "
                f"{natbias or 'no natural bias'}: averaging them mixes biases that mean different "
                "things; average checkpoints of one run (or of runs with the same --natbias-* options)"
            )


def check_same_parameters(first, path, params, first_path):
    """Same vocabularies (rows of the token embeddings), parameter names and shapes."""

    def vocabularies(state):
        return ", ".join(
            f"{name.split('.')[0]} {tuple(tensor.shape)[0]}"
            for name, tensor in sorted(state.items())
            if name.endswith("embed_tokens.weight")
        )

    if vocabularies(params) != vocabularies(first):
        raise AverageError(
            f"{first_path} and {path} have different vocabularies ({vocabularies(first)} "
            f"against {vocabularies(params)} entries): average only checkpoints trained on one "
            "dictionary (one data-bin)"
        )
    if params.keys() != first.keys():
        missing = sorted(set(first) ^ set(params))[:3]
        raise AverageError(
            f"{first_path} and {path} hold different parameters "
            f"({', '.join(missing)} ...): average only checkpoints of one model"
        )
    for name, tensor in params.items():
        if tensor.shape != first[name].shape:
            raise AverageError(
                f"{first_path} and {path} differ in the shape of {name} ({tuple(first[name].shape)} "
                f"and {tuple(tensor.shape)}): average only checkpoints of one model"
            )


def average(paths):
    """The first checkpoint's state with each model tensor averaged over ``paths``."""
    import torch

    from fairseq_natbias.checkpoint_loading import read_checkpoint

    check_same_settings(paths)
    state = read_checkpoint(paths[0])
    first = state["model"]
    sums = {name: t.double() for name, t in first.items() if t.is_floating_point()}
    for path in paths[1:]:
        params = read_checkpoint(path)["model"]
        check_same_parameters(first, path, params, paths[0])
        for name, tensor in params.items():
            if name in sums:
                sums[name] += tensor.double()
            elif not torch.equal(tensor, first[name]):
                raise AverageError(
                    f"{name} ({tensor.dtype}) differs between {paths[0]} and {path} and "
                    "cannot be averaged: average only checkpoints of one model"
                )
        del params  # one input's weights in memory at a time, besides the sums
    state["model"] = {
        name: (sums[name] / len(paths)).to(first[name].dtype) if name in sums else first[name]
        for name in first
    }
    return state


def main(argv=None):
    args = build_parser().parse_args(argv)
    import logging
    import warnings

    warnings.filterwarnings("ignore")  # hydra's and torch's deprecation notices inside fairseq
    # fairseq before the plugin, which then allow-lists what fairseq pickles into
    # a checkpoint, so that torch.load can read the saved config
    import fairseq  # noqa: F401
    import torch

    import fairseq_natbias  # noqa: F401

    logging.getLogger().setLevel(logging.WARNING)
    try:
        paths = input_paths(args)
        state = average(paths)
    except NaturalBiasError as error:  # AverageError, or a CheckpointError naming the fix
        sys.exit(f"{PROG}: error: {error}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.save(state, args.output)
    print(f"averaged {len(paths)} checkpoints: {' '.join(paths)}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
