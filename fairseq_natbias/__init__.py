"""fairseq_natbias: the natural (log-unigram) output bias of Meister et al.
(ACL 2023) as a fairseq plugin, built on the framework-free core ``natbias``.

    fairseq-train DATA --user-dir fairseq_natbias --arch transformer_natbias ...
    fairseq-train LM-DATA --task language_modeling --user-dir fairseq_natbias \\
        --arch transformer_lm_natbias ...

Importing it registers the architectures and the criteria with fairseq (which
is how ``--user-dir`` works).
"""

import os

try:
    import fairseq  # noqa: F401
except ImportError as error:  # one line naming the fix, not a traceback from deep inside
    raise ImportError(
        "fairseq_natbias needs fairseq: `pip install --no-deps ve-fairseq==0.12.3` "
        "and its runtime needs (docs/installation.md), or `make install`"
    ) from error

from fairseq_natbias import (  # noqa: F401  (each registers with fairseq on import)
    checkpoint_loading,
    numpy_compat,  # noqa: F401  (before fairseq builds a dataset)
    transformer_lm_natbias,
    transformer_natbias,
    unigram_label_smoothed_cross_entropy,
    unigram_regularized_cross_entropy,
)
from natbias import __version__  # noqa: F401  (one version for both packages)


def plugin_dir() -> str:
    """This package's directory: the ``--user-dir`` to give fairseq from a
    process that has already imported ``fairseq_natbias`` (fairseq refuses a
    second copy of a user module under the same name)."""
    return os.path.dirname(os.path.abspath(__file__))
