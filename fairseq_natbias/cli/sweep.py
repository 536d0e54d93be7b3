"""natbias-sweep: run the real fairseq-generate over several output-bias scales
lambda and logit adjustments tau, and report BLEU, chrF (sacreBLEU, with
signatures) and diversity (distinct-1..4 and their mean D) side by side::

    natbias-sweep data-bin/iwslt14.de-en runs/iwslt/unigram/seed1/checkpoint_best.pt \\
        --lambdas 0 0.25 0.5 0.75 1 --taus 0 --out-dir analysis/sweep \\
        -- --beam 5 --batch-size 64 --post-process sentencepiece

Every (lambda, tau) pair is one fairseq-generate run with
--model-overrides "{'natbias_bias_scale': lambda, 'natbias_logit_adjustment': tau}",
i.e. logits W phi + lambda b - tau log p_unigram (lambda = 1, tau = 0: the
model as trained). Options after `--` go to fairseq-generate unchanged.
Written to --out-dir: generate.lambda<l>.tau<t>.txt (raw output), sweep.tsv,
sweep.md and sweep.png.
"""

import sys
from pathlib import Path

from fairseq_natbias.analysis import sweep
from fairseq_natbias.checkpoint_loading import has_output_bias
from natbias.tools import cli

PROG = "natbias-sweep"


def build_parser():
    parser = cli.parser_for(PROG, __doc__)
    parser.add_argument("data", help="fairseq data directory (binarised)")
    parser.add_argument("checkpoint", help="model checkpoint (.pt)")
    cli.add_grid_arguments(parser, default_lambdas=[1.0])
    parser.add_argument("--gen-subset", default="test", help="split to translate (default: test)")
    cli.add_tokenize_argument(parser, "word splitting for distinct-n")
    parser.add_argument("--out-dir", required=True, help="directory for outputs and tables")
    return parser


def run(args):
    grid = sweep.settings(args.lambdas, args.taus)
    # read first: a file that is no checkpoint is refused in one line
    if not has_output_bias(args.checkpoint) and any(s.lam != 1 for s in grid):
        print(
            f"{PROG}: note: {args.checkpoint} has no output bias, so lambda changes "
            "nothing; only tau does",
            file=sys.stderr,
        )
    rows = sweep.sweep(
        args.data,
        args.checkpoint,
        grid,
        args.out_dir,
        ["--gen-subset", args.gen_subset, *args.generate_args],
        args.tokenize,
        progress=cli.progress_on_stderr(PROG),
    )
    paths = sweep.write_sweep(rows, args.out_dir)
    cli.print_written(paths, Path(paths[1]).read_text(encoding="utf-8"))  # the Markdown table
    return rows


def main(argv=None):
    argv, generate_args = cli.split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.generate_args = generate_args
    cli.exit_on_bad_input(PROG, run, args)


if __name__ == "__main__":
    main()
