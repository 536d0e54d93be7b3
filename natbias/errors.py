"""The package's errors: bad input, and a missing optional part, each with a
message that names the fix."""


class NaturalBiasError(ValueError):
    """Bad input to the natural bias. The message says what is wrong and how to
    fix it; the command-line tools print it as one line, without a traceback."""


class MissingExtraError(ImportError):
    """A part whose framework is not installed (fairseq for the plugin); the
    message names the extra and the command that installs it."""


def require_private(adapter: str, framework: str, tested: str, fix: str, owners) -> None:
    """An adapter's ``_compat`` check, on import, of each private name it uses
    (``owners``: (object, names) pairs): a ``framework`` that lacks one is
    refused in one line naming the version ``tested`` and the ``fix``."""
    for owner, names in owners:
        for name in names:
            if not hasattr(owner, name):
                raise NaturalBiasError(
                    f"{adapter} is tested with {tested}, whose {name} {framework} lacks: {fix}"
                )
