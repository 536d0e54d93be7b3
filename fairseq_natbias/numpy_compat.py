"""One numpy alias fairseq 0.12 needs and numpy 2 removed.

fairseq 0.12's data pipeline calls ``numpy.compat.long`` (Python's ``int`` in
numpy 1.x): ``TokenBlockDataset`` (the ``language_modeling`` task, with
``--sample-break-mode eos``) and ``LanguagePairDataset.num_tokens_vec``.
numpy 2 removed ``numpy.compat``, so ``fairseq-train --task language_modeling``
fails at dataset load with "module 'numpy' has no attribute 'compat'".

Why a shim and not ``numpy<2``: torch, matplotlib and a user's own tools
increasingly expect numpy 2, and pinning 1.x would downgrade a researcher's
environment for one alias. The shim adds exactly that alias, only where numpy
lacks ``compat`` (numpy 1.x is left untouched), when the plugin is imported
(``--user-dir fairseq_natbias`` or ``import fairseq_natbias``), before fairseq
builds any dataset.
"""

import types

import numpy


def install() -> bool:
    """Give numpy a ``compat.long`` (= ``int``) if it has no ``compat``;
    True when it did."""
    if hasattr(numpy, "compat"):
        return False
    numpy.compat = types.SimpleNamespace(long=int)
    return True


install()
