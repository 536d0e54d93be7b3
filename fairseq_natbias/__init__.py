"""fairseq_natbias: the natural (log-unigram) output bias of Meister et al.
(ACL 2023) as a fairseq plugin, built on the framework-free core ``natbias``.

    fairseq-train DATA --user-dir fairseq_natbias --arch transformer_natbias ...
    fairseq-train LM-DATA --task language_modeling --user-dir fairseq_natbias \\
        --arch transformer_lm_natbias ...

Importing it registers the architectures and the criteria with fairseq (which
is how ``--user-dir`` works). Bad input raises NaturalBiasError, which in a
fairseq command's process (fairseq-train, ...) ends it with one line naming
the fix, and elsewhere (a notebook, the hub interface) reaches the caller.
"""

import os
import sys

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
from natbias.errors import NaturalBiasError


def plugin_dir() -> str:
    """This package's directory: the ``--user-dir`` to give fairseq from a
    process that has already imported ``fairseq_natbias`` (fairseq refuses a
    second copy of a user module under the same name)."""
    return os.path.dirname(os.path.abspath(__file__))


def fairseq_command():
    """The fairseq command this process runs (``fairseq-train``, ...), else None."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("fairseq_cli."):  # python -m fairseq_cli.train
        return "fairseq-" + spec.name.split(".")[1].replace("_", "-")
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith("fairseq-") else None


def print_errors_in_one_line(command: str) -> None:
    """Chain a ``sys.excepthook`` printing an uncaught NaturalBiasError as argparse would,
    ``COMMAND: error: MESSAGE`` (exit 1): fairseq has no place to catch a plugin's error."""
    previous = sys.excepthook

    def excepthook(kind, error, traceback):
        if issubclass(kind, NaturalBiasError):
            print(f"{command}: error: {error}", file=sys.stderr)
        else:
            previous(kind, error, traceback)

    sys.excepthook = excepthook


if fairseq_command() is not None:
    print_errors_in_one_line(fairseq_command())
