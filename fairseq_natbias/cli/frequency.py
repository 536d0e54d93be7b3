"""natbias-frequency: average log-probability of each reference token against
its log-unigram probability in the training data, binned into equal-length
intervals, with the full model and with the output bias dropped (Meister et
al., 2023, Fig. 4)::

    natbias-frequency data-bin/iwslt14.de-en \\
        --model zero=runs/iwslt/zero/seed1/checkpoint_best.pt \\
        --model unigram=runs/iwslt/unigram/seed1/checkpoint_best.pt \\
        --out-dir analysis/fig4

Given a zero and a unigram model, frequency.png has the four panels of Fig. 4
(columns: models; upper row: all parameters; lower row: bias dropped). Also
written: frequency_bins.csv (a row per non-empty bin and model) and
frequency_tokens.csv (a row per token type in the split).
"""

from fairseq_natbias.analysis import frequency
from natbias.errors import NaturalBiasError
from natbias.tools.cli import parser_for, print_written, progress_on_stderr, run_tool

PROG = "natbias-frequency"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("data", help="fairseq data directory the models were trained on")
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="[LABEL=]CHECKPOINT",
        help="a checkpoint, optionally labelled (repeat: one column each; "
        "default label: the model's --natbias-init)",
    )
    parser.add_argument("--gen-subset", default="test", help="split to score (default: test)")
    parser.add_argument(
        "--bins",
        type=int,
        default=frequency.DEFAULT_BINS,
        help=f"equal-length intervals of log-unigram (default {frequency.DEFAULT_BINS})",
    )
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--cpu", action="store_true", help="score on the CPU even if CUDA is there")
    parser.add_argument(
        "--user-dir",
        help="another fairseq plugin the checkpoint needs (this package is loaded already)",
    )
    parser.add_argument("--out-dir", required=True, help="directory for the CSVs and frequency.png")
    return parser


def run(args):
    import torch

    if args.user_dir:
        from argparse import Namespace

        from fairseq import utils

        from fairseq_natbias.in_process import this_copy

        try:
            utils.import_user_module(Namespace(user_dir=this_copy(args.user_dir)))
        except ImportError as error:
            raise NaturalBiasError(f"--user-dir {args.user_dir}: {error}") from error
    use_cuda = torch.cuda.is_available() and not args.cpu
    checkpoints = [
        (label, path) if sep else (None, spec)
        for spec in args.model
        for label, sep, path in [spec.partition("=")]
    ]
    analysis = frequency.analyse(
        checkpoints,
        args.data,
        args.gen_subset,
        args.bins,
        args.max_tokens,
        use_cuda,
        progress=progress_on_stderr(PROG),
    )
    for scores in analysis.scores:
        print(
            f"{scores.label}: {scores.sentences} sentences, "
            f"{int(scores.occurrences.sum())} reference tokens of "
            f"{int(scores.present.sum())} types; unigram {scores.unigram_source}"
        )
        if not scores.has_bias:
            print(
                f"{scores.label}: the model has no output bias, so the bias-dropped "
                "row equals the full model"
            )
    print_written(frequency.write_outputs(analysis, args.out_dir))
    return analysis


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
