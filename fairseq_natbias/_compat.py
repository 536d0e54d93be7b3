"""Every private fairseq name the plugin uses, in one place, with the version
it is tested with: fairseq 0.12 (ve-fairseq 0.12.3). An upgrade that moves
one of them breaks here, in one line naming it:

* ``distributed.utils._TensorPlaceholder``: what a multi-rank checkpoint
  pickles for each tensor sent apart (allow-listed for weights-only loading);
* ``token_block_utils_fast._get_slice_indices_fast``: how language_modeling
  cuts a split into blocks (counted for --add-bos-token's prefixes);
* ``ARCH_MODEL_NAME_REGISTRY`` (public, but rewritten here): CTranslate2's
  converter checks a checkpoint by the model name its ``--arch`` maps to.
"""

from contextlib import contextmanager

import fairseq
from fairseq.data import token_block_utils_fast
from fairseq.distributed import utils as distributed_utils
from fairseq.models import ARCH_MODEL_NAME_REGISTRY

from natbias.errors import NaturalBiasError

TESTED = "0.12"
for owner, name in (
    (distributed_utils, "_TensorPlaceholder"),
    (token_block_utils_fast, "_get_slice_indices_fast"),
):
    if not hasattr(owner, name):
        raise NaturalBiasError(
            f"fairseq_natbias is tested with fairseq {TESTED}, whose {name} fairseq "
            f"{fairseq.__version__} lacks: pip install 've-fairseq==0.12.3' --no-deps"
        )
TensorPlaceholder = distributed_utils._TensorPlaceholder
slice_indices = token_block_utils_fast._get_slice_indices_fast


@contextmanager
def arch_read_as(arch: str, stock_names: dict):
    """``--arch arch``'s model read as its stock one (``stock_names[its name]``)
    by whoever asks fairseq's registry, until the block ends."""
    own = ARCH_MODEL_NAME_REGISTRY[arch]
    ARCH_MODEL_NAME_REGISTRY[arch] = stock_names[own]
    try:
        yield
    finally:
        ARCH_MODEL_NAME_REGISTRY[arch] = own
