"""Whether a transformers model is sharded over processes, and a context in
which its output layer can be read whole, for the bias statistics
(:mod:`natbias.hf.callback`): FSDP1's flat parameters gathered by its
wrapper, DeepSpeed ZeRO-3's partitions by ``GatheredParameters``; DTensors
(FSDP2, tensor parallelism) are read whole by :mod:`natbias.sharding`.

The Trainer hands its callbacks the model it was given, not the wrapper it
trains (``trainer.model_wrapped``). FSDP2 and tensor parallelism shard that
model itself, and ZeRO-3 hooks into it, but FSDP1's root wrapper holds the
model and cannot be reached from it: the caller passes it as ``wrapped``.
"""

import contextlib
from typing import Optional

import torch

from natbias.errors import NaturalBiasError
from natbias.sharding import is_dtensor


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of ``model`` is split over processes."""
    if _fsdp1_roots(model):
        return True
    return any(
        is_dtensor(parameter) or _fsdp1_flattened(parameter) or _zero3(parameter)
        for parameter in model.parameters()
    )


def runner(model: torch.nn.Module, wrapped: Optional[torch.nn.Module] = None) -> torch.nn.Module:
    """What to run ``model``'s forward through: ``wrapped`` where it is
    FSDP1's wrapper around ``model`` (the Trainer's ``model_wrapped``), else
    ``model`` (a DDP wrapper's forward would be a collective on one process)."""
    if wrapped is None or wrapped is model or not _is_fsdp1(wrapped):
        return model
    return wrapped if any(module is model for module in wrapped.modules()) else model


def gathered(model: torch.nn.Module, wrapped: Optional[torch.nn.Module] = None):
    """A context in which the output layer of ``model`` (its head's W, b and
    gain, and its own parameters) is whole on every process: a collective.
    FSDP1 gathers the whole model (``summon_full_params``), through
    ``wrapped`` where the model is inside its wrapper (:func:`runner`);
    ZeRO-3 gathers those parameters alone; nothing to do for DTensors or an
    unsharded model."""
    if any(_zero3(parameter) for parameter in model.parameters()):
        import deepspeed

        # The head's partitions (W, b, the gain) and the model's own parameters
        # (final_logits_bias), whole on every process, read-only.
        head = model.get_output_embeddings()
        parameters = [*head.parameters(), *model.parameters(recurse=False)]
        return deepspeed.zero.GatheredParameters(parameters, modifier_rank=None)
    roots = _fsdp1_roots(runner(model, wrapped))
    check_reachable(model, wrapped, roots)
    if not roots:
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    stack = contextlib.ExitStack()
    for root in roots:
        stack.enter_context(FullyShardedDataParallel.summon_full_params(root, writeback=False))
    return stack


def check_reachable(model: torch.nn.Module, wrapped=None, roots: Optional[list] = None) -> None:
    """Refuses, in one line, a model whose FSDP1-flattened parameters no
    wrapper found gathers: the model was given without its root wrapper."""
    roots = _fsdp1_roots(runner(model, wrapped)) if roots is None else roots
    covered = {id(p) for root in roots for p in root.parameters()}
    if any(_fsdp1_flattened(p) and id(p) not in covered for p in model.parameters()):
        raise NaturalBiasError(
            "this model is sharded by FSDP1, whose wrapper cannot be found from the model "
            "the Trainer hands its callbacks: add the callback with "
            "natbias.hf.log_bias_statistics(trainer), which reads trainer.model_wrapped"
        )


def _is_fsdp1(module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(module, FullyShardedDataParallel)


def _fsdp1_flattened(parameter) -> bool:
    """FSDP1 marks the parameters it has flattened (and its flat parameters)."""
    return bool(getattr(parameter, "_fsdp_flattened", False))


def _zero3(parameter) -> bool:
    """ZeRO-3 gives each partitioned parameter an id (stages 1 and 2 do not)."""
    return hasattr(parameter, "ds_id")


def _fsdp1_roots(model: torch.nn.Module) -> list:
    """The outermost FSDP1 wrappers in ``model`` (``model`` itself if it is one)."""
    roots, inner = [], set()
    for module in model.modules():
        if _is_fsdp1(module) and id(module) not in inner:
            roots.append(module)
            inner.update(id(m) for m in module.modules() if m is not module)
    return roots
