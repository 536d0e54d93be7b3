"""fairseq_natbias: the natural (log-unigram) output bias of Meister et al.
(ACL 2023) as a fairseq plugin, built on the framework-free core ``natbias``.

    fairseq-train DATA --user-dir fairseq_natbias --arch transformer_natbias ...
    fairseq-train LM-DATA --task language_modeling --user-dir fairseq_natbias \\
        --arch transformer_lm_natbias ...

Importing it registers the architectures and the criteria with fairseq (which
is how ``--user-dir`` works). In a process of fairseq's own command line
(fairseq-train, fairseq-generate, ...) the natural bias's errors
(:class:`natbias.errors.NaturalBiasError`, bad input) end it with one line
naming the fix; anywhere else (a notebook, the hub interface) they are
raised to the caller.
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
    """Chain a ``sys.excepthook`` that prints an uncaught NaturalBiasError as
    ``COMMAND: error: MESSAGE`` (argparse's form; the exit status stays 1):
    its message names the fix, and fairseq's commands have no place of their
    own that would catch a plugin's error."""
    previous = sys.excepthook
    if getattr(previous, "natbias_one_line", False):
        return

    def excepthook(kind, error, traceback):
        if issubclass(kind, NaturalBiasError):
            print(f"{command}: error: {error}", file=sys.stderr)
        else:
            previous(kind, error, traceback)

    excepthook.natbias_one_line = True
    sys.excepthook = excepthook


if fairseq_command() is not None:
    print_errors_in_one_line(fairseq_command())
