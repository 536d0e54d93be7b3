"""The package's errors: bad input, and a missing optional part, each with a
message that names the fix."""


class NaturalBiasError(ValueError):
    """Bad input to the natural bias. The message says what is wrong and how to
    fix it; the command-line tools print it as one line, without a traceback."""


class MissingExtraError(ImportError):
    """A part whose framework is not installed (fairseq for the plugin); the
    message names the extra and the command that installs it."""
