"""natbias-alc: area under the validation learning curve (ALC) of fairseq-train
runs over their first K updates (composite trapezoidal rule, divided by the
span of updates covered; Meister et al., 2023, sec. 4.2 and Fig. 3), one number
per run, then their mean and standard error (e.g. over seeds)::

    natbias-alc runs/iwslt/unigram/seed*/train.log --metric bleu --max-updates 20000

Each LOG is a fairseq-train log (``--log-format simple`` or ``json``, console
output or ``--log-file``) or a run directory holding ``train.log``. Validation
BLEU is in the logs when training ran with ``--eval-bleu``.
"""

from fairseq_natbias.analysis import alc
from fairseq_natbias.analysis.stats import mean_stderr
from fairseq_natbias.cli.common import parser_for, run_tool

PROG = "natbias-alc"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("logs", nargs="+", metavar="LOG", help="train logs or run directories")
    parser.add_argument("--metric", default="bleu",
                        help="key of fairseq's validation lines: bleu (default), chrf, loss, ...")
    parser.add_argument("--max-updates", type=int, default=alc.PAPER_MAX_UPDATES, metavar="K",
                        help="first K updates (default 20000, the paper's); 0: the whole curve")
    parser.add_argument("--subset", default="valid", help="validation subset (default: valid)")
    return parser


def run(args):
    limit = args.max_updates or None
    results = []
    for path in args.logs:
        result = alc.alc_of_log(path, args.metric, limit, args.subset)
        results.append(result.alc)
        print(f"{path}\t{alc.format_alc(result)}")
    summary = mean_stderr(results)
    print(f"ALC of valid {args.metric}, first {limit or 'all'} updates: "
          f"{summary.format(4)}")
    return summary


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
