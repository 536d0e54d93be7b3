"""natbias-report: mean test BLEU and chrF with standard errors per dataset and
bias initialisation (Meister et al., 2023, Figs. 2 and 9) and the ALC of
validation BLEU (and chrF, if the logs have it) over the first K updates
(Figs. 3 and 10), as a Markdown table and PNG plots::

    natbias-report runs --out-dir analysis/report

Run grid (one directory per training run)::

    RUNS/<dataset>/<init>/seed<k>/train.log        fairseq-train console output
                                  /test.bleu.json   sacrebleu REF -i HYP -m bleu
                                  /test.chrf.json   sacrebleu REF -i HYP -m chrf

A score file may also hold only the number (sacrebleu -b). RUNS/<init>/seed<k>/
(one dataset, named after RUNS, or NAME=RUNS) works too, e.g. the recipes' grids::

    natbias-report iwslt14=work/iwslt14/de-en/runs wmt14=work/wmt14/de-en/runs \\
        --out-dir analysis/report

Written to --out-dir: report.md, runs.tsv, test_bleu.png, test_chrf.png,
alc_bleu.png, alc_chrf.png (those that have numbers).
"""


from fairseq_natbias.analysis import alc, report
from fairseq_natbias.cli.common import parser_for, print_written, progress_on_stderr, run_tool

PROG = "natbias-report"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("runs", nargs="+", metavar="[NAME=]RUNS", help="run-grid root(s)")
    parser.add_argument("--max-updates", type=int, default=alc.PAPER_MAX_UPDATES, metavar="K",
                        help="ALC over the first K updates (default 20000); 0: all")
    parser.add_argument("--out-dir", required=True, help="directory for report.md and plots")
    return parser


def run(args):
    result = report.build_report(
        args.runs, args.max_updates or None,
        progress=progress_on_stderr(PROG))
    paths = report.write_report(result, args.out_dir)
    print_written(paths, report.markdown(result))
    return result


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
