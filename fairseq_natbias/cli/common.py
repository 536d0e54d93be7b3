"""What the analysis console scripts share: one-line errors instead of
tracebacks, and quiet logging (fairseq's import turns the root logger to DEBUG)."""

import argparse
import logging
import sys

from fairseq_natbias.analysis import AnalysisError


def parser_for(prog: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def split_passthrough(argv):
    """``(own arguments, arguments after "--")``."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def exit_on_bad_input(prog: str, run, args):
    """Run ``run(args)``; bad input (an AnalysisError, a UnigramError, a file
    that cannot be read) ends the program with ``prog: error: ...``."""
    from fairseq_natbias.unigram import UnigramError

    logging.getLogger().setLevel(logging.WARNING)
    try:
        return run(args)
    except (AnalysisError, UnigramError, OSError) as error:
        sys.exit(f"{prog}: error: {error}")


def print_written(paths, table=None):
    """The table (Markdown text) if given, then a ``wrote PATH`` line per output."""
    if table is not None:
        print(table)
    for path in paths:
        print(f"wrote {path}")
