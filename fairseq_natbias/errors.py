"""The package's shared errors: the ground floor, importing nothing.

They live here, below every module that raises or catches them, so that the
checkpoint reader (:mod:`fairseq_natbias.checkpoint_loading`) can raise its
own error without importing the analysis tools that print it.

Both are ValueErrors: the console scripts print them as one line
(``prog: error: ...``, :mod:`fairseq_natbias.cli.common`), and fairseq-train's
model building (:mod:`fairseq_natbias.natural_bias`) turns ValueErrors into a
one-line exit too.
"""


class AnalysisError(ValueError):
    """Bad input to an analysis tool; the message says what is wrong and how to
    fix it. The console scripts print it as one line, without a traceback.
    Imported by the tools as ``fairseq_natbias.analysis.AnalysisError``."""


class CheckpointError(AnalysisError):
    """A file that cannot serve as the checkpoint asked for (or a checkpoint
    that cannot be loaded with the data directory given); the message names
    the fix. An AnalysisError (so a ValueError): the analysis tools print it
    as one line, as they do their own errors. Imported as
    ``fairseq_natbias.checkpoint_loading.CheckpointError``."""
