"""Every OLMo-core name natbias.olmo_core uses, in one place, with the
versions it is tested with: ai2-olmo-core 3.0.x. OLMo-core marks much of
this as internal (the head's ``w_out``, ``Transformer.init_weights``'s
order, the numpy datasets' ``offsets`` and ``_read_chunk_from_array``
layout), so another minor version is refused in one line rather than
trained on a head that silently lacks the bias.
"""

from contextlib import contextmanager
from importlib import import_module

from packaging.version import Version

from natbias.errors import MissingExtraError, NaturalBiasError

TESTED = (Version("3.0"), Version("3.1"))  # >= 3.0, < 3.1
INSTALL = "pip install 'fairseq-natbias[olmo]' (ai2-olmo-core>=3.0,<3.1)"


def check_version(version: str) -> str:
    """``version`` if natbias.olmo_core is tested with it, else the one-line refusal."""
    low, high = TESTED
    if not low <= Version(version) < high:
        raise NaturalBiasError(
            f"natbias.olmo_core is tested with ai2-olmo-core >={low},<{high}, "
            f"not {version}: {INSTALL}"
        )
    return version


try:
    from olmo_core.version import VERSION
except ImportError as error:  # pragma: no cover - the extra is not installed
    raise MissingExtraError(f"natbias.olmo_core needs OLMo-core: {INSTALL}") from error

check_version(VERSION)

# The names below are OLMo-core 3.0's; a version outside TESTED never reaches them.
from olmo_core.data.numpy_dataset import (  # noqa: E402
    NumpyDatasetBase,
    NumpyDatasetConfig,
    NumpyFSLDataset,
    NumpyFSLDatasetMixture,
)
from olmo_core.data.utils import get_labels  # noqa: E402
from olmo_core.nn.lm_head import LMHead, LMLossImplementation  # noqa: E402
from olmo_core.nn.transformer import Transformer  # noqa: E402
from olmo_core.train.callbacks import Callback  # noqa: E402
from olmo_core.train.common import ReduceType  # noqa: E402

# The numpy datasets whose instances are the consecutive ``sequence_length``
# chunks from the start of each file, ``offsets`` of them per file: their
# targets are counted from the memory-mapped files directly.
CHUNKED_DATASETS = (NumpyFSLDataset, NumpyFSLDatasetMixture)


def is_chunked(dataset) -> bool:
    """Whether ``dataset``'s targets can be counted from its files' leading
    chunks (no label masks, no instance filter)."""
    return (
        type(dataset) in CHUNKED_DATASETS
        and getattr(dataset, "_label_mask_paths", None) is None
        and getattr(dataset, "instance_filter_config", None) is None
        and getattr(dataset, "max_target_sequence_length", None) in (None, dataset.sequence_length)
    )


# The state-dict keys of the head's b and gain (its linear map is ``lm_head.w_out``).
HEAD_BIAS_KEY, HEAD_GAIN_KEY = "lm_head.w_out.bias", "lm_head.w_out.gain_param"


def head_of(model):
    """The model's LM head (an ``LMHead``; None in a pipeline stage without
    it) and its linear map ``w_out``."""
    head = getattr(model, "lm_head", None)
    return head, None if head is None else head.w_out


def set_head_linear(model, linear) -> None:
    model.lm_head.w_out = linear


def save_hf_model(save_dir, state, model, tokenizer=None) -> None:
    """OLMo-core's conversion of a model's state to a transformers checkpoint
    (imported here when called: it imports transformers)."""
    from olmo_core.nn.hf.checkpoint import save_hf_model as save

    save(save_dir, state, model, tokenizer)


def uses_fused_loss(head) -> bool:
    return head.loss_implementation == LMLossImplementation.fused_linear


@contextmanager
def fused_linear_kernel(function):
    """OLMo-core's fused-linear loss computed by ``function`` while the
    context lasts, in place of Liger-Kernel's
    ``LigerFusedLinearCrossEntropyFunction.apply`` (its positional
    arguments and its (loss, z-loss, accuracy) result): OLMo-core 3.0 has no
    other, and Liger-Kernel's is a GPU kernel, so a machine without one
    checks the head's fused path with a CPU stand-in (tests, research)."""
    # the module, not the function of that name its package exports
    losses = import_module("olmo_core.nn.functional.cross_entropy_loss")
    saved = losses._fused_linear_cross_entropy_loss
    losses._fused_linear_cross_entropy_loss = function
    try:
        yield
    finally:
        losses._fused_linear_cross_entropy_loss = saved


class _ScaleHeadInput:
    """A forward hook giving ``scale`` the tensor that OLMo-core 3.0's
    ``LMHead.forward`` hands its linear map: ``h = self.norm(x) if self.norm
    is not None else x``, then ``w_out(h)``, or the fused-linear loss of h,
    ``w_out.weight`` and ``w_out.bias``. A callable object, not a closure:
    ``copy.deepcopy`` of the model then scales by the copy's gain."""

    def __init__(self, scale):
        self.scale = scale

    def __call__(self, module, args, *rest):
        if rest and isinstance(rest[0], dict):  # the head's pre-hook: (module, args, kwargs)
            return (self.scale(args[0]), *args[1:]), rest[0]
        return self.scale(rest[0])  # the norm's hook: (module, args, output)


def scale_head_input(head, scale) -> None:
    """Makes ``scale`` act on h, the head's input after its norm: a hook on
    the norm's output (a norm would undo a scale of its input), else a
    pre-hook on the head (appended: FSDP's own pre-hook, which gathers the
    head's parameters, runs first)."""
    hook = _ScaleHeadInput(scale)
    if head.norm is not None:
        head.norm.register_forward_hook(hook)
    else:
        head.register_forward_pre_hook(hook, with_kwargs=True)


__all__ = [
    "VERSION",
    "Callback",
    "LMHead",
    "NumpyDatasetBase",
    "NumpyDatasetConfig",
    "ReduceType",
    "Transformer",
    "check_version",
    "fused_linear_kernel",
    "get_labels",
    "HEAD_BIAS_KEY",
    "HEAD_GAIN_KEY",
    "head_of",
    "save_hf_model",
    "is_chunked",
    "set_head_linear",
    "scale_head_input",
    "uses_fused_loss",
]
