"""Every private fairseq (tested: 0.12, ve-fairseq 0.12.3) and CTranslate2 name
the plugin uses: a multi-rank checkpoint's ``_TensorPlaceholder``,
language_modeling's block slicer ``_get_slice_indices_fast``, a converter's
``_load`` (:class:`LoadSpec`), and ``ARCH_MODEL_NAME_REGISTRY`` rewritten for
CTranslate2's check. A fairseq that moved one is refused here in one line."""

from contextlib import contextmanager

import fairseq
from fairseq.data import token_block_utils_fast
from fairseq.distributed import utils as distributed_utils
from fairseq.models import ARCH_MODEL_NAME_REGISTRY

from fairseq_natbias import checkpoint_loading
from natbias.errors import require_private

require_private("fairseq_natbias", f"fairseq {fairseq.__version__}", "fairseq 0.12",
                "pip install 've-fairseq==0.12.3' --no-deps",
                ((distributed_utils, ("_TensorPlaceholder",)),
                 (token_block_utils_fast, ("_get_slice_indices_fast",))))  # fmt: skip
# Stands for each tensor a multi-rank checkpoint sends apart: allow-listed.
checkpoint_loading.FAIRSEQ_CHECKPOINT_GLOBALS.append(distributed_utils._TensorPlaceholder)
checkpoint_loading.allow_fairseq_checkpoints()
slice_indices = token_block_utils_fast._get_slice_indices_fast


class LoadSpec:
    """Mixin before CTranslate2's converter: its ``_load``, the method its own
    converters implement (its way in), made ``load_spec(stock_load)``."""

    def _load(self):
        return self.load_spec(super()._load)


@contextmanager
def arch_read_as(arch: str, stock_names: dict):
    """``--arch arch``'s model name read as ``stock_names[its name]`` in the block."""
    own = ARCH_MODEL_NAME_REGISTRY[arch]
    ARCH_MODEL_NAME_REGISTRY[arch] = stock_names[own]
    try:
        yield
    finally:
        ARCH_MODEL_NAME_REGISTRY[arch] = own
