"""The text-only console scripts natbias-alc, -report, -dynamics and -distinct,
and what every console script shares: one-line errors, quiet logging, an
engine's part found through its entry points."""

import argparse
import functools
import logging
import sys
from importlib.metadata import entry_points

from natbias.errors import MissingExtraError, NaturalBiasError
from natbias.tools import alc, distinct, dynamics, report, runs
from natbias.tools.generate_output import parse_generate_output, read_text_lines
from natbias.tools.stats import mean_stderr


def parser_for(prog: str, doc: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_values_argument(parser, flag, kind, default, metavar, what, nargs="+") -> None:
    """``flag V ...``: values of type ``kind``, the default shown in the help."""
    shown = " ".join(
        format(value, "g") if isinstance(value, float) else str(value) for value in default
    )
    parser.add_argument(
        flag,
        type=kind,
        nargs=nargs,
        default=list(default),
        metavar=metavar,
        help=f"{what} (default: {shown})",
    )


def add_tokenize_argument(parser, what: str = "word splitting") -> None:
    parser.add_argument(
        "--tokenize",
        choices=distinct.TOKENIZERS,
        default="13a",
        help=f"{what} (default: sacreBLEU's 13a)",
    )


def add_max_updates_argument(parser, what: str) -> None:
    """``--max-updates K`` (natbias-alc, natbias-report): the paper's 20000 by default."""
    parser.add_argument(
        "--max-updates", type=int, default=alc.PAPER_MAX_UPDATES, metavar="K", help=what
    )


def run_tool(prog: str, build_parser, run, argv=None) -> None:
    """A console script's main. Returns None: sys.exit would print anything else."""
    exit_on_bad_input(prog, run, build_parser().parse_args(argv))


def exit_on_bad_input(prog: str, run, args):
    """``run(args)``; bad input (NaturalBiasError, OSError) exits with ``prog: error: ...``."""
    logging.getLogger().setLevel(logging.WARNING)
    try:
        return run(args)
    except (NaturalBiasError, OSError) as error:
        sys.exit(f"{prog}: error: {error}")


EXTRA = {"fairseq": "fairseq", "transformers": "hf"}


def engine(group: str, kind: str):
    """Engine ``kind``'s (fairseq, transformers) part for a console script that
    serves either engine's models: entry point ``kind`` of group
    ``natbias.<group>``, which the adapters declare (pyproject.toml). So the
    core and its tools import no adapter, and a user of one engine needs not the
    other's; an engine not installed is bad input, one line naming its extra."""
    found = [point for point in entry_points(group=f"natbias.{group}") if point.name == kind]
    if not found:
        raise NaturalBiasError(
            f"no {kind} entry point in natbias.{group}: reinstall fairseq-natbias"
        )
    try:
        part = found[0].load()
    except MissingExtraError as error:
        raise NaturalBiasError(str(error)) from None
    except ImportError as error:
        extra = EXTRA[kind]
        raise NaturalBiasError(
            f"{kind} models need the [{extra}] extra: pip install 'fairseq-natbias[{extra}]' "
            f"({error})"
        ) from None
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import lowers it to INFO
    return part


def progress_on_stderr(prog: str):
    return lambda message: print(f"{prog}: {message}", file=sys.stderr)


def print_written(paths, table=None):
    """The table (Markdown text) if given, then a ``wrote PATH`` line per output."""
    if table is not None:
        print(table)
    for path in paths:
        print(f"wrote {path}")


ALC_DOC = """natbias-alc: area under the validation learning curve (ALC) of fairseq-train
runs over their first K updates (composite trapezoidal rule, divided by the
span of updates covered; Meister et al., 2023, sec. 4.2), one number per run,
then their mean and standard error::

    natbias-alc runs/iwslt/unigram/seed*/train.log --metric bleu --max-updates 20000

Each LOG is a fairseq-train log (--log-format simple or json) or a run
directory holding train.log. Validation BLEU needs fairseq-train --eval-bleu.
"""


def alc_parser():
    parser = parser_for("natbias-alc", ALC_DOC)
    parser.add_argument("logs", nargs="+", metavar="LOG", help="train logs or run directories")
    parser.add_argument(
        "--metric",
        default="bleu",
        help="key of fairseq's validation lines: bleu (default), chrf, loss, ...",
    )
    add_max_updates_argument(
        parser, "first K updates (default 20000, the paper's); 0: the whole curve"
    )
    parser.add_argument("--subset", default="valid", help="validation subset (default: valid)")
    return parser


def run_alc(args):
    limit = args.max_updates or None
    results = []
    for path in args.logs:
        result = alc.alc_of_log(path, args.metric, limit, args.subset)
        results.append(result.alc)
        print(f"{path}\t{alc.format_alc(result)}")
    summary = mean_stderr(results)
    print(f"ALC of valid {args.metric}, first {limit or 'all'} updates: {summary.format(4)}")
    return summary


alc_main = functools.partial(run_tool, "natbias-alc", alc_parser, run_alc)


REPORT_DOC = """natbias-report: mean test BLEU and chrF with standard errors per dataset and
bias initialisation (Meister et al., 2023, Figs. 2 and 9) and the ALC of
validation BLEU (and chrF) over the first K updates (Figs. 3 and 10)::

    natbias-report runs --out-dir analysis/report
    natbias-report iwslt14=work/iwslt14/de-en/runs --out-dir analysis/report

Run grid: RUNS/<dataset>/<init>/seed<k>/ holding train.log (fairseq-train's
output), test.bleu.json and test.chrf.json (sacrebleu REF -i HYP -m bleu|chrf,
or just the number); RUNS/<init>/seed<k>/ for one dataset (named after RUNS,
or NAME=RUNS). Written to --out-dir: report.md, runs.tsv, test_bleu.png,
test_chrf.png, alc_bleu.png, alc_chrf.png (those that have numbers).
"""


def report_parser():
    parser = parser_for("natbias-report", REPORT_DOC)
    parser.add_argument("runs", nargs="+", metavar="[NAME=]RUNS", help="run-grid root(s)")
    add_max_updates_argument(parser, "ALC over the first K updates (default 20000); 0: all")
    parser.add_argument("--out-dir", required=True, help="directory for report.md and plots")
    return parser


def run_report(args):
    result = report.build_report(
        args.runs, args.max_updates or None, progress=progress_on_stderr("natbias-report")
    )
    paths = report.write_report(result, args.out_dir)
    print_written(paths, report.markdown(result))
    return result


report_main = functools.partial(run_tool, "natbias-report", report_parser, run_report)


DYNAMICS_DOC = """natbias-dynamics: bias and divergence statistics and validation BLEU over
training updates (log-scale x), one line per bias initialisation, mean ±
standard error over seeds shaded (Meister et al., 2023, Figs. 1, 5, 13, 14)::

    natbias-dynamics runs --out-dir analysis/dynamics
    natbias-dynamics --log unigram=a/train.log --log zero=c/train.log --out-dir out

RUNS is a run grid (see natbias-report --help); --log INIT=LOG adds single
logs (repeat an INIT for its seeds). Writes <metric>.png per metric and
dynamics.tsv. Metrics: validation keys with a valid_ prefix (valid_bleu),
and of the train_inner lines: {}.
""".format(", ".join(name for name in dynamics.LABELS if name != "valid_bleu"))

SINGLE_LOGS_DATASET = "runs"


def dynamics_parser():
    parser = parser_for("natbias-dynamics", DYNAMICS_DOC)
    parser.add_argument("runs", nargs="*", metavar="[NAME=]RUNS", help="run-grid root(s)")
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="INIT=LOG",
        help="a single fairseq-train log of a run with this init",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=list(dynamics.DEFAULT_METRICS),
        help="default: " + " ".join(dynamics.DEFAULT_METRICS),
    )
    parser.add_argument("--linear-x", action="store_true", help="linear instead of log-scale x")
    parser.add_argument("--out-dir", required=True, help="directory for the plots")
    return parser


def single_log_runs(specs):
    grid = []
    for seed, spec in enumerate(specs, start=1):
        init, sep, path = spec.partition("=")
        if not sep or not init or not path:
            raise NaturalBiasError(f"--log {spec}: expected INIT=LOG")
        grid.append(runs.Run(SINGLE_LOGS_DATASET, init, seed, path, log_file=path))
    return grid


def run_dynamics(args):
    if not args.runs and not args.log:
        raise NaturalBiasError("give a run grid (RUNS) or logs (--log INIT=LOG)")
    grid = (runs.discover_runs(args.runs) if args.runs else []) + single_log_runs(args.log)
    result = dynamics.collect(grid, args.metrics)
    for note in result.notes:
        print(f"natbias-dynamics: note: {note}")
    print_written(dynamics.write_dynamics(result, args.out_dir, logx=not args.linear_x))
    return result


dynamics_main = functools.partial(run_tool, "natbias-dynamics", dynamics_parser, run_dynamics)


DISTINCT_DOC = """natbias-distinct: lexical diversity of generated text, distinct-n D_1..D_4
(unique n-grams / n-grams over all texts) and their mean D (Kobayashi et al.,
2023, eqs. 5 and 6)::

    natbias-distinct generate-test.txt          # fairseq-generate output: D- lines
    natbias-distinct hypotheses.txt             # plain text, one text a line
"""


def distinct_parser():
    parser = parser_for("natbias-distinct", DISTINCT_DOC)
    parser.add_argument("texts", help="fairseq-generate output or a plain text file")
    add_tokenize_argument(parser)
    parser.add_argument("--max-n", type=int, default=distinct.MAX_N, help="largest n (default 4)")
    return parser


def read_texts(path):
    lines = read_text_lines(path, "fairseq-generate's output or a plain text file")
    generated = parse_generate_output(lines)
    if generated:
        return [
            s.detokenized if s.detokenized is not None else s.hypothesis
            for _, s in sorted(generated.items())
            if s.hypothesis is not None
        ]
    return lines


def run_distinct(args):
    scores = distinct.text_diversity(read_texts(args.texts), args.tokenize, args.max_n)
    for name, value in scores.items():
        print(f"{name}\t{value:.4f}")
    return scores


distinct_main = functools.partial(run_tool, "natbias-distinct", distinct_parser, run_distinct)
