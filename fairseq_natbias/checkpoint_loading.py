"""Lets torch >= 2.6 load fairseq checkpoints.

torch 2.6 made ``torch.load(weights_only=True)`` the default; fairseq 0.12
calls ``torch.load`` without the argument, and its checkpoints pickle the
training configuration as an ``argparse.Namespace``, so ``fairseq-generate``
and resuming fail with an unpickling error. We allow-list exactly that type
(``torch.serialization.get_unsafe_globals_in_checkpoint`` names no other for a
``transformer_natbias`` checkpoint), which keeps weights-only loading (no
arbitrary code from a checkpoint) instead of switching it off.
"""

import argparse

import torch

FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace]

if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)
