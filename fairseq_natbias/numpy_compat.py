"""numpy 2 removed ``numpy.compat``, whose ``long`` fairseq 0.12's data
pipeline still calls (``TokenBlockDataset``, ``LanguagePairDataset``): the
alias is added back where numpy lacks it, on import of the plugin, so that a
researcher's numpy 2 need not be downgraded for one name."""

import types

import numpy


def install() -> bool:
    """Give numpy a ``compat.long`` (= ``int``) if it has no ``compat``; True when it did."""
    if hasattr(numpy, "compat"):
        return False
    numpy.compat = types.SimpleNamespace(long=int)
    return True


install()
