"""Lets torch >= 2.6 load fairseq checkpoints.

torch 2.6 made ``torch.load(weights_only=True)`` the default; fairseq 0.12
calls ``torch.load`` without the argument, and its checkpoints pickle the
training configuration as an ``argparse.Namespace`` (and, after training with
``--eval-bleu``, numpy arrays of BLEU statistics in the saved metrics), so
``fairseq-generate`` and resuming fail with an unpickling error. We allow-list
exactly those types (what ``torch.serialization.get_unsafe_globals_in_checkpoint``
names for ``transformer_natbias`` checkpoints), which keeps weights-only
loading (no arbitrary code from a checkpoint) instead of switching it off.
"""

import argparse

import numpy
import torch


def _numpy_array_globals():
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct
    dtype_classes = [type(numpy.dtype(name)) for name in
                     ("int32", "int64", "float32", "float64", "uint16", "bool")]
    return [_reconstruct, numpy.ndarray, numpy.dtype, *dtype_classes]


FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace, *_numpy_array_globals()]

if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
