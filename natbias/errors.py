"""The package's one error type: bad input, with a message that names the fix."""


class NaturalBiasError(ValueError):
    """Bad input to the natural bias. The message says what is wrong and how to
    fix it; the command-line tools print it as one line, without a traceback."""
