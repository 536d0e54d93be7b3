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

from natbias.errors import MissingExtraError, NaturalBiasError

FAIRSEQ_MISSING = (
    "fairseq_natbias needs fairseq 0.12: pip install 'fairseq-natbias[fairseq]' and "
    "pip install --no-deps ve-fairseq==0.12.3 (Python 3.11, 3.12; docs/installation.md), "
    "or make install"
)


def running_command():
    """The command-line tool this process runs, when it is fairseq's (``fairseq-train``,
    ``python -m fairseq_cli.train``) or one of this package's (``natbias-step0``), else None."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("fairseq_cli."):  # python -m fairseq_cli.train
        return "fairseq-" + spec.name.split(".")[1].replace("_", "-")
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith(("fairseq-", "natbias-")) else None


def print_errors_in_one_line(command: str) -> None:
    """Chain a ``sys.excepthook`` printing an uncaught NaturalBiasError or
    MissingExtraError as argparse would, ``COMMAND: error: MESSAGE`` (exit 1):
    fairseq has no place to catch a plugin's error, nor a console script an import's."""
    previous = sys.excepthook

    def excepthook(kind, error, traceback):
        if issubclass(kind, (NaturalBiasError, MissingExtraError)):
            print(f"{command}: error: {error}", file=sys.stderr)
        else:
            previous(kind, error, traceback)

    sys.excepthook = excepthook


if (_command := running_command()) is not None:
    print_errors_in_one_line(_command)

try:
    import fairseq  # noqa: F401
except ImportError as error:  # one line naming the fix, not a traceback from deep inside
    raise MissingExtraError(FAIRSEQ_MISSING) from error

from fairseq_natbias import (  # noqa: E402,F401  (each registers with fairseq on import)
    _compat,  # fairseq's private names, checked; its checkpoints' private type allow-listed
    checkpoint_loading,
    numpy_compat,  # noqa: F401  (before fairseq builds a dataset)
    transformer_lm_natbias,
    transformer_natbias,
    unigram_label_smoothed_cross_entropy,
    unigram_regularized_cross_entropy,
)
from natbias import __version__  # noqa: E402,F401  (one version for both packages)


def plugin_dir() -> str:
    """This package's directory: the ``--user-dir`` to give fairseq from a
    process that has already imported ``fairseq_natbias`` (fairseq refuses a
    second copy of a user module under the same name)."""
    return os.path.dirname(os.path.abspath(__file__))
