"""What the natural bias needs of a model whose parameters are sharded over
processes: FSDP2 and tensor parallelism (DTensor parameters), FSDP1 (flat
parameters, gathered by ``summon_full_params``), or a model built on the
meta device and materialised later.

Reading b, W or the gain outside a forward pass is a collective under
sharding: every process must take part, or the main process waits for ever.
"""

import contextlib

import torch

from natbias.errors import NaturalBiasError

try:  # torch >= 2.4; before it, no parameter can be a DTensor
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
except ImportError:  # pragma: no cover - old torch, or a build without torch.distributed
    DTensor = Replicate = distribute_tensor = None


def is_dtensor(tensor) -> bool:
    return DTensor is not None and isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from its shards on every process (a
    collective for a DTensor: call it on every process); a plain tensor as it is."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def replicated_like(tensor: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``tensor``, the same on every process, as a replicated DTensor on
    ``reference``'s mesh where ``reference`` is a DTensor (tensor parallelism
    hands the head DTensor features); else as it is. Its gradient is summed
    over the mesh on the way back."""
    if not is_dtensor(reference) or is_dtensor(tensor):
        return tensor
    mesh = reference.device_mesh
    return DTensor.from_local(tensor, mesh, [Replicate()] * mesh.ndim, run_check=False)


@torch.no_grad()
def fill_(parameter: torch.Tensor, values: torch.Tensor) -> None:
    """Writes the whole ``values`` into ``parameter``, each process its own
    shard where it is a DTensor (a collective: call it on every process)."""
    values = values.to(torch.float32)
    if is_dtensor(parameter):
        values = distribute_tensor(
            values.to(parameter.to_local().device), parameter.device_mesh, parameter.placements
        )
    else:
        values = values.to(parameter.device)
    parameter.copy_(values.reshape(parameter.shape).to(parameter.dtype))


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
