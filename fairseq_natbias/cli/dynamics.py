"""natbias-dynamics: bias and divergence statistics and validation BLEU over
training updates (log-scale x), one line per bias initialisation, mean ±
standard error over seeds shaded (Meister et al., 2023, Figs. 1, 5, 13, 14)::

    natbias-dynamics runs --out-dir analysis/dynamics
    natbias-dynamics --log unigram=a/train.log --log unigram=b/train.log \\
        --log zero=c/train.log --out-dir analysis/dynamics

RUNS is a run grid, RUNS/<dataset>/<init>/seed<k>/train.log (see
natbias-report --help); --log INIT=LOG adds single logs (repeat an INIT for
its seeds). Metrics: kl_unigram, kl_uniform, bias_kl, bias_norm, gain, weight_norm
(from the train_inner lines that fairseq_natbias adds them to) and any
validation key with a valid_ prefix (valid_bleu, valid_loss). Writes one
<metric>.png per metric and dynamics.tsv (the plotted numbers).
"""

from fairseq_natbias.analysis import AnalysisError, dynamics, runs
from fairseq_natbias.cli.common import parser_for, print_written, run_tool

PROG = "natbias-dynamics"
SINGLE_LOGS_DATASET = "runs"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("runs", nargs="*", metavar="[NAME=]RUNS", help="run-grid root(s)")
    parser.add_argument("--log", action="append", default=[], metavar="INIT=LOG",
                        help="a single fairseq-train log of a run with this init")
    parser.add_argument("--metrics", nargs="+", default=list(dynamics.DEFAULT_METRICS),
                        help="default: " + " ".join(dynamics.DEFAULT_METRICS))
    parser.add_argument("--linear-x", action="store_true", help="linear instead of log-scale x")
    parser.add_argument("--out-dir", required=True, help="directory for the plots")
    return parser


def single_log_runs(specs):
    grid = []
    for seed, spec in enumerate(specs, start=1):
        init, sep, path = spec.partition("=")
        if not sep or not init or not path:
            raise AnalysisError(f"--log {spec}: expected INIT=LOG")
        grid.append(runs.Run(SINGLE_LOGS_DATASET, init, seed, path, log_file=path))
    return grid


def run(args):
    if not args.runs and not args.log:
        raise AnalysisError("give a run grid (RUNS) or logs (--log INIT=LOG)")
    grid = (runs.discover_runs(args.runs) if args.runs else []) + single_log_runs(args.log)
    result = dynamics.collect(grid, args.metrics)
    for note in result.notes:
        print(f"{PROG}: note: {note}")
    print_written(dynamics.write_dynamics(result, args.out_dir, logx=not args.linear_x))
    return result


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
