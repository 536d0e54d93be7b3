"""Whether a transformers model is sharded over processes, and a context in
which its parameters can be read whole (FSDP1's flat parameters gathered),
for the bias statistics (:mod:`natbias.hf.callback`). Tensors:
:mod:`natbias.sharding`.
"""

import contextlib

import torch

from natbias.errors import NaturalBiasError
from natbias.sharding import is_dtensor


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is split over processes."""
    if _fsdp1_roots(model):
        return True
    return any(is_dtensor(parameter) for parameter in model.parameters())


def gathered(model: torch.nn.Module):
    """A context in which FSDP1's flat parameters of ``model`` are whole on
    every process (a collective; the whole model, as FSDP1 gathers it);
    nothing to do for DTensors (:func:`full`) or an unsharded model.
    DeepSpeed ZeRO-3's partitions are refused: not gathered yet."""
    if any(hasattr(parameter, "ds_id") for parameter in model.parameters()):
        raise NaturalBiasError(
            "the bias statistics do not gather DeepSpeed ZeRO-3's partitioned parameters "
            "yet: leave BiasStatisticsCallback out under ZeRO-3 (stages 1 and 2 are fine)"
        )
    roots = _fsdp1_roots(model)
    if not roots:
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    stack = contextlib.ExitStack()
    for root in roots:
        stack.enter_context(FullyShardedDataParallel.summon_full_params(root, writeback=False))
    return stack


def _fsdp1_roots(model: torch.nn.Module) -> list:
    """The outermost FSDP1 wrappers in ``model`` (``model`` itself if it is one)."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed.fsdp import FullyShardedDataParallel

    roots, inner = [], set()
    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel) and id(module) not in inner:
            roots.append(module)
            inner.update(id(m) for m in module.modules() if m is not module)
    return roots
