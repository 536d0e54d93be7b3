"""What the natural bias needs of tensors sharded over processes (DTensors:
FSDP2 and tensor parallelism) or made on the meta device and filled later.

Reading b, W or the gain outside a forward pass is a collective under
sharding: every process must take part, or the main process waits for ever.
(Whole models, FSDP1 among them, in transformers: :mod:`natbias.hf.sharded`.)
"""

import sys

import torch


def is_dtensor(tensor) -> bool:
    # No tensor is a DTensor until torch.distributed.tensor is imported (by
    # FSDP2, tensor parallelism, distribute_tensor): it is not imported here,
    # which would add a tenth to every fairseq command's start (sympy, fx).
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


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
    from torch.distributed.tensor import DTensor, Replicate

    mesh = reference.device_mesh
    return DTensor.from_local(tensor, mesh, [Replicate()] * mesh.ndim, run_check=False)


@torch.no_grad()
def fill_(parameter: torch.Tensor, values: torch.Tensor) -> None:
    """Writes the whole ``values`` into ``parameter``, each process its own
    shard where it is a DTensor (a collective: call it on every process)."""
    values = values.to(torch.float32)
    if is_dtensor(parameter):
        from torch.distributed.tensor import distribute_tensor

        values = distribute_tensor(
            values.to(parameter.to_local().device), parameter.device_mesh, parameter.placements
        )
    else:
        values = values.to(parameter.device)
    parameter.copy_(values.reshape(parameter.shape).to(parameter.dtype))
