"""What the analysis console scripts share: one-line errors instead of
tracebacks, and quiet logging (fairseq's import turns the root logger to DEBUG)."""

import argparse
import logging
import sys

from fairseq_natbias.analysis import AnalysisError
from fairseq_natbias.analysis.distinct import TOKENIZERS


def parser_for(prog: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_tokenize_argument(parser, what: str = "word splitting") -> None:
    """``--tokenize``: how distinct-n splits words, sacreBLEU's 13a by default
    so that distinct-n counts the words BLEU counts."""
    parser.add_argument("--tokenize", choices=TOKENIZERS, default="13a",
                        help=f"{what} (default: sacreBLEU's 13a)")


def add_grid_arguments(parser, default_lambdas) -> None:
    """``--lambdas`` and ``--taus``: the (lambda, tau) grid of the sweep tools
    (output-bias scale, Kobayashi et al.; logit adjustment, Menon et al.)."""
    shown = " ".join(f"{value:g}" for value in default_lambdas)
    parser.add_argument("--lambdas", type=float, nargs="+", default=list(default_lambdas),
                        metavar="L", help=f"output-bias scales in [0, 1] (default: {shown})")
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0], metavar="T",
                        help="logit adjustments (default: 0)")


def split_passthrough(argv):
    """``(own arguments, arguments after "--")``."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def run_tool(prog: str, build_parser, run, argv=None) -> None:
    """A console script's main: parse ``argv`` (None: the command line), then
    ``run`` under :func:`exit_on_bad_input`. Returns None: the installed
    script passes main's value to sys.exit, which would print anything else."""
    exit_on_bad_input(prog, run, build_parser().parse_args(argv))


def exit_on_bad_input(prog: str, run, args):
    """Run ``run(args)``; bad input (an AnalysisError, a UnigramError, a file
    that cannot be read) ends the program with ``prog: error: ...``."""
    logging.getLogger().setLevel(logging.WARNING)
    try:
        return run(args)
    except _bad_input_errors() as error:  # evaluated once run has raised
        sys.exit(f"{prog}: error: {error}")


def _bad_input_errors():
    """The exception types that mean bad input. UnigramError only once
    fairseq_natbias.unigram is imported (it cannot have been raised before):
    importing it here would import torch into the tools that only read logs."""
    unigram = sys.modules.get("fairseq_natbias.unigram")
    return (AnalysisError, OSError) + ((unigram.UnigramError,) if unigram else ())


def progress_on_stderr(prog: str):
    """A ``progress`` callback for the analysis functions: ``prog: message``
    on stderr, leaving stdout to the results."""
    return lambda message: print(f"{prog}: {message}", file=sys.stderr)


def print_written(paths, table=None):
    """The table (Markdown text) if given, then a ``wrote PATH`` line per output."""
    if table is not None:
        print(table)
    for path in paths:
        print(f"wrote {path}")
