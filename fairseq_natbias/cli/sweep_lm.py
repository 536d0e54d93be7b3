"""natbias-lm-sweep: Kobayashi et al.'s experiment for a language model. For
each output-bias scale lambda (and logit adjustment tau), continue the
prompts of a held-out split and report diversity (distinct-1..4, D) next to
quality (the references' NLL under the controlled model; chrF/BLEU of the
continuations against the references' own continuations)::

    natbias-lm-sweep lm-bin checkpoints/lm/checkpoint_best.pt \\
        --lambdas 0 0.25 0.5 0.75 1 --decoding sample --out-dir analysis/lm-sweep

The checkpoint must be a transformer_lm_natbias one. Written to --out-dir:
continuations.<decoding>.lambda<l>.tau<t>.txt, sweep_lm.tsv, sweep_lm.md,
sweep_lm.png.
"""

from pathlib import Path

from fairseq_natbias.analysis import sweep, sweep_lm
from natbias.tools import cli

PROG = "natbias-lm-sweep"


def build_parser():
    parser = cli.parser_for(PROG, __doc__)
    parser.add_argument("data", help="language-model data directory (binarised, dict.txt)")
    parser.add_argument("checkpoint", help="transformer_lm_natbias checkpoint (.pt)")
    cli.add_grid_arguments(parser, default_lambdas=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument(
        "--split", default="test", help="split to take prompts from (default: test)"
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=3,
        help="tokens of each sentence given as the prompt (default: 3)",
    )
    parser.add_argument(
        "--max-continuation",
        type=int,
        default=30,
        help="most tokens generated after the prompt (default: 30)",
    )
    parser.add_argument("--decoding", choices=sweep_lm.DECODINGS, default="sample")
    parser.add_argument("--beam", type=int, default=5, help="beam size with --decoding beam")
    parser.add_argument(
        "--sampling-topk", type=int, default=-1, help="top-k sampling (default: off)"
    )
    parser.add_argument(
        "--sampling-topp", type=float, default=-1.0, help="top-p sampling (default: off)"
    )
    parser.add_argument("--seed", type=int, default=1, help="sampling seed (default: 1)")
    cli.add_tokenize_argument(parser, "word splitting for distinct-n")
    parser.add_argument("--out-dir", required=True, help="directory for outputs and tables")
    return parser


def run(args):
    grid = sweep.settings(args.lambdas, args.taus)
    rows = sweep_lm.sweep_lm(
        args.data,
        args.checkpoint,
        grid,
        args.out_dir,
        split=args.split,
        prompt_tokens=args.prompt_tokens,
        decoding=args.decoding,
        max_continuation=args.max_continuation,
        beam=args.beam,
        topk=args.sampling_topk,
        topp=args.sampling_topp,
        seed=args.seed,
        tokenize=args.tokenize,
        progress=cli.progress_on_stderr(PROG),
    )
    paths = sweep_lm.write_sweep_lm(rows, args.out_dir)
    cli.print_written(paths, Path(paths[1]).read_text(encoding="utf-8"))  # the Markdown table
    return rows


def main(argv=None):
    cli.run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
