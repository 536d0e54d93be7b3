"""Format 1 (natbias 1.0 to 2.0) saved the gain's parameter u and the bigram
weight beta as 0-d tensors; format 2 keeps them of shape (1,), because FSDP
and tensor parallelism shard no 0-d parameter. A format-1 state dict loads
into a format-2 model through :func:`upgrade`, and its optimizer state (Adam's
moments of u, 0-d too) is reshaped before the first step that uses it.
"""

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

# Parameters that took a format-1 value, whose optimizer state may still be 0-d.
_UPGRADED: "weakref.WeakSet[torch.nn.Parameter]" = weakref.WeakSet()
_HOOK = []


def upgrade(module: torch.nn.Module, state_dict: dict, prefix: str, names) -> None:
    """Reshape, in ``state_dict``, each 0-d value saved for one of the
    ``names`` of ``module`` that is now of shape (1,)."""
    for name in names:
        key, parameter = prefix + name, module._parameters.get(name)
        value = state_dict.get(key)
        if parameter is None or not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 0 and tuple(parameter.shape) == (1,):
            state_dict[key] = value.reshape(1)
            _UPGRADED.add(parameter)
            if not _HOOK:
                _HOOK.append(register_optimizer_step_pre_hook(_reshape_state))


def _reshape_state(optimizer, args, kwargs) -> None:
    """A global optimizer pre-step hook, registered only once a format-1
    value was loaded: the 0-d moments of an upgraded parameter become (1,)."""
    for parameter in list(_UPGRADED):
        state = optimizer.state.get(parameter)
        if not state:
            continue
        for key, value in state.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.dim() == 0:
                state[key] = value.reshape(1)
        _UPGRADED.discard(parameter)
