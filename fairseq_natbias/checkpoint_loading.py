"""Reading fairseq checkpoints: the one place that does it for the plugin,
and its ground floor (it imports nothing of the plugin).

torch's weights-only loading (the default since torch 2.6) refuses fairseq
0.12's checkpoints (a pickled ``argparse.Namespace``, numpy arrays) and, on
2 or more ranks, the ``DictConfig`` of fairseq's multi-rank resume: exactly
those types are allow-listed on import, which keeps weights-only loading
instead of switching it off. A file that cannot be used raises
:class:`CheckpointError`, naming the fix.
"""

import argparse
import os
import typing
import zipfile
from collections import defaultdict

import numpy
import torch

from natbias.errors import NaturalBiasError


class CheckpointError(NaturalBiasError):
    """A file that cannot serve as the checkpoint asked for; the message names the fix."""


WEIGHTS_ONLY_HINT = (
    "torch's weights-only loading refused the checkpoint: it holds objects beyond "
    "those fairseq_natbias allow-lists for fairseq checkpoints (checkpoint_loading.py). "
    "For a checkpoint you trust, set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1"
)
WRITTEN_BY_FAIRSEQ = "give a checkpoint_*.pt written by fairseq-train"


def _fairseq_checkpoint_globals():
    from omegaconf import DictConfig, ListConfig, base, nodes

    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    dtypes = [
        type(numpy.dtype(name))
        for name in ("int32", "int64", "float32", "float64", "uint16", "bool")
    ]
    value_nodes = [nodes.AnyNode, nodes.StringNode, nodes.IntegerNode, nodes.FloatNode]
    containers = [DictConfig, ListConfig, base.ContainerMetadata, base.Metadata]
    # what those containers pickle besides themselves
    extra = [nodes.BooleanNode, typing.Any, dict, list, int, defaultdict]
    # (and fairseq's private _TensorPlaceholder, added by fairseq_natbias._compat)
    arrays = [_reconstruct, numpy.ndarray, numpy.dtype, *dtypes]
    return [argparse.Namespace, *arrays, *containers, *value_nodes, *extra]


FAIRSEQ_CHECKPOINT_GLOBALS = _fairseq_checkpoint_globals()


def allow_fairseq_checkpoints() -> None:
    """Allow-list those types: on import, and again before each read, since a
    ``torch.serialization.safe_globals`` block takes its types off the list
    when it ends, ours among them (transformers' Trainer opens one for
    numpy's types whenever it resumes)."""
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)


allow_fairseq_checkpoints()


def require_file(path: str) -> None:
    if os.path.isdir(path):
        raise CheckpointError(
            f"{path} is a directory: give the checkpoint file in it (e.g. checkpoint_best.pt)"
        )
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{path}: no such checkpoint; train a model first or give "
            "the path of a checkpoint_*.pt written by fairseq-train"
        )


def read_checkpoint(path: str) -> dict:
    """What fairseq saved (``model``, ``cfg`` or ``args``, ...), on the CPU.
    Memory-mapped when the file is a zip archive (what torch.save has written
    since torch 1.6): tensors are read only when touched, so reading the
    configuration of a large checkpoint costs next to nothing."""
    require_file(path)
    allow_fairseq_checkpoints()
    try:
        state = torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path))
    except Exception as error:  # unpickling a file that is no checkpoint fails in any way
        raise refusal(path, error) from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} holds a {type(state).__name__}, not a fairseq checkpoint; {WRITTEN_BY_FAIRSEQ}"
        )
    return state


def refusal(path: str, error: Exception) -> CheckpointError:
    """Why torch could not load ``path``, as the error to raise."""
    if not zipfile.is_zipfile(path):
        return not_a_checkpoint(path, "not a torch.save archive")
    if "weights only" in str(error).lower():
        return CheckpointError(f"{path}: {WEIGHTS_ONLY_HINT}")
    text = str(error).strip()
    return not_a_checkpoint(path, text.splitlines()[0] if text else type(error).__name__)


def not_a_checkpoint(path: str, reason: str) -> CheckpointError:
    return CheckpointError(f"{path} is not a fairseq checkpoint ({reason}); {WRITTEN_BY_FAIRSEQ}")


def saved_model_args(path: str):
    """The model configuration a fairseq checkpoint was trained with
    (``cfg.model``; ``args`` for checkpoints from before fairseq's hydra
    configs), None if it holds neither. The weights are not read."""
    state = read_checkpoint(path)
    cfg = state.get("cfg")
    if cfg is not None and cfg.get("model") is not None:
        return cfg["model"]
    return state.get("args")
