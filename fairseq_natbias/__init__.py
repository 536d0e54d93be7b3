"""fairseq_natbias: the natural (log-unigram) output bias of Meister et al.
(ACL 2023) as a fairseq plugin.

    fairseq-train DATA --user-dir fairseq_natbias --arch transformer_natbias ...
    fairseq-train LM-DATA --task language_modeling --user-dir fairseq_natbias \
        --arch transformer_lm_natbias ...
"""

import os

__version__ = "0.3.0"


def plugin_dir() -> str:
    """This package's directory: the ``--user-dir`` to give fairseq from a
    process that has already imported ``fairseq_natbias`` (fairseq refuses a
    second copy of a user module under the same name)."""
    return os.path.dirname(os.path.abspath(__file__))

try:
    import fairseq  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised by hand
    raise ImportError(
        "fairseq_natbias needs fairseq, which is not installed. Install it with\n"
        "    pip install --no-deps ve-fairseq==0.12.3\n"
        "    pip install hydra-core omegaconf bitarray regex sacrebleu cython "
        "cffi scikit-learn tqdm packaging\n"
        "or run `make install` in the fairseq-natbias repository."
    ) from error

from fairseq_natbias import checkpoint_loading  # noqa: E402,F401
from fairseq_natbias import numpy_compat  # noqa: E402,F401
from fairseq_natbias import transformer_lm_natbias  # noqa: E402,F401
from fairseq_natbias import transformer_natbias  # noqa: E402,F401
from fairseq_natbias import unigram_regularized_cross_entropy  # noqa: E402,F401
