"""Every OLMo-core name natbias.olmo_core uses, in one place, with the
versions it is tested with: ai2-olmo-core 3.0.x. OLMo-core marks much of
this as internal (the head's ``w_out``, ``Transformer.init_weights``'s
order, the numpy datasets' ``offsets`` and ``_read_chunk_from_array``
layout), so another minor version is refused in one line rather than
trained on a head that silently lacks the bias.
"""

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


__all__ = [
    "VERSION",
    "Callback",
    "LMHead",
    "NumpyDatasetBase",
    "NumpyDatasetConfig",
    "ReduceType",
    "Transformer",
    "check_version",
    "get_labels",
    "HEAD_BIAS_KEY",
    "HEAD_GAIN_KEY",
    "head_of",
    "save_hf_model",
    "is_chunked",
    "set_head_linear",
    "uses_fused_loss",
]
