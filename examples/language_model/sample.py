"""Sample continuations of a prompt from a transformer_lm_natbias model, once
per output-bias scale lambda: the logits g W phi + b become g W phi + lambda b
at generation time (Kobayashi et al., 2023; lambda = 1 is the model as
trained, lambda = 0 drops the frequency bias). The scale is a fairseq model
override given to ``from_pretrained``; the training checkpoint is unchanged.

    python examples/language_model/sample.py --checkpoint WORK/runs/unigram/checkpoint_best.pt \\
        --data-bin WORK/data-bin --spm-model WORK/spm.model --prompt "A man" --lambdas 1 0.5

Every lambda sees the same random stream (--seed), so the samples differ only
through lambda.
"""

import argparse
import logging
import os
import sys
import warnings

# examples/paper: the paper's analyses and the demo's helpers, not installed
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "paper"))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="sample.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", required=True, help="transformer_lm_natbias checkpoint")
    parser.add_argument("--data-bin", required=True, help="its data directory (dict.txt)")
    parser.add_argument("--spm-model", required=True, help="its SentencePiece model")
    parser.add_argument("--prompt", default="A man", help="text to continue (default: %(default)s)")
    parser.add_argument(
        "--lambdas",
        type=float,
        nargs="+",
        default=[1.0, 0.5],
        help="output-bias scales (default: 1 0.5)",
    )
    parser.add_argument("--samples", type=int, default=3, help="samples per lambda (default: 3)")
    parser.add_argument(
        "--max-len", type=int, default=30, help="most tokens per sample (default: 30)"
    )
    parser.add_argument("--seed", type=int, default=1)
    return parser.parse_args(argv)


def load(args, bias_scale):
    import decomposition

    from fairseq_natbias.transformer_lm_natbias import TransformerLanguageModelNatbias
    from natbias.errors import NaturalBiasError

    # One-line errors for a missing checkpoint, another model's, a wrong file.
    _, model_class = decomposition.check_natbias_checkpoint(args.checkpoint)
    if model_class is not TransformerLanguageModelNatbias:
        raise NaturalBiasError(
            f"{args.checkpoint} is a translation model; give a transformer_lm_natbias checkpoint"
        )
    for path, what in (
        (os.path.join(args.data_bin, "dict.txt"), "the language model's dict.txt"),
        (args.spm_model, "the SentencePiece model"),
    ):
        if not os.path.isfile(path):
            raise NaturalBiasError(f"{path}: no such file; give {what}")
    folder, name = os.path.split(os.path.abspath(args.checkpoint))
    return TransformerLanguageModelNatbias.from_pretrained(
        folder,
        name,
        data_name_or_path=os.path.abspath(args.data_bin),
        bpe="sentencepiece",
        sentencepiece_model=os.path.abspath(args.spm_model),
        natbias_bias_scale=bias_scale,
    )


def main(argv=None):
    args = parse_args(argv)
    warnings.filterwarnings("ignore")  # hydra's and torch's deprecation notices inside fairseq
    import torch

    from natbias.errors import NaturalBiasError

    logging.getLogger().setLevel(logging.WARNING)  # fairseq logs every loaded option at INFO
    try:
        for bias_scale in args.lambdas:
            hub = load(args, bias_scale)
            torch.manual_seed(args.seed)
            samples = hub.sample(
                [args.prompt] * args.samples,
                sampling=True,
                sampling_topk=-1,
                max_len_b=args.max_len,
            )
            for sample in samples:
                print(f"lambda={bias_scale:g}\t{sample}")
    except NaturalBiasError as error:
        sys.exit(f"sample.py: error: {error}")


if __name__ == "__main__":
    main()
