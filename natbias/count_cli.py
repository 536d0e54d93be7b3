r"""natbias-count: write a counts file, the prior that every adapter takes
(``counts_file=``, ``--natbias-init file --natbias-counts``; App. A.7).

From token files (OLMo-core's, nanoGPT's ``train.bin``: flat ids of one dtype;
``--instance-length L``: OLMo-core's instances, whose first token is no target)::

    natbias-count --tokens part-*.npy --dtype uint32 --vocab-size 100278 --output c.counts

from a 🤗 dataset saved with ``save_to_disk`` (``--causal``: a decoder's, whose
rows' first tokens are no target)::

    natbias-count --hf-dataset tokenised/ --column input_ids --causal \
        --vocab-size 50257 --output c.counts

or, with fairseq, from tokenised text or a binarised data directory::

    natbias-count --dict data-bin/dict.en.txt --text c4.en.tok --output c4.counts
    natbias-count --dict data-bin/dict.en.txt --data data-bin \
        --source-lang de --target-lang en --output train.counts

Token files and datasets are counted by ``--workers`` processes and keyed by
id in the file; tokenised text and fairseq data by the dictionary's symbols.
"""

import os
import sys

from natbias.counts import count_dataset, count_token_files, write_counts_file
from natbias.counts.sources import TOKEN_DTYPES
from natbias.errors import MissingExtraError, NaturalBiasError
from natbias.tools.cli import engine, parser_for

PROG = "natbias-count"


def build_parser():
    parser = parser_for(PROG, __doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokens", nargs="+", metavar="FILE", help="flat token-id files")
    source.add_argument("--hf-dataset", metavar="DIR", help="a 🤗 dataset saved to disk")
    source.add_argument("--text", nargs="+", help="fairseq: tokenised text file(s), .gz allowed")
    source.add_argument("--data", help="fairseq: a binarised data directory")
    parser.add_argument("--dtype", choices=TOKEN_DTYPES, help="with --tokens: the ids' dtype")
    parser.add_argument("--vocab-size", type=int, help="with --tokens, --hf-dataset")
    parser.add_argument("--instance-length", type=int, metavar="L", help="with --tokens")
    parser.add_argument("--column", default="input_ids", help="with --hf-dataset")
    parser.add_argument("--causal", action="store_true", help="with --hf-dataset")
    parser.add_argument("--workers", type=int, default=1, help="processes counting at once")
    parser.add_argument("--dict", help="fairseq: the target dictionary (dict.TGT.txt)")
    parser.add_argument("--source-lang", help="with --data")
    parser.add_argument("--target-lang", help="with --data")
    parser.add_argument("--split", default="train", help="with --data (default: train)")
    parser.add_argument("--output", required=True, help="counts file to write")
    return parser


def count_ids_of(args):
    """The counts of ``--tokens`` or ``--hf-dataset``, one per id."""
    if not args.vocab_size or args.vocab_size < 1:
        raise NaturalBiasError(f"--{'tokens' if args.tokens else 'hf-dataset'} needs --vocab-size")
    caching = dict(cache=False, workers=args.workers)
    if args.tokens:
        if args.dtype is None:
            raise NaturalBiasError("--tokens needs --dtype (the ids' dtype, e.g. uint16)")
        return count_token_files(args.tokens, args.dtype, args.vocab_size,
                                 instance_length=args.instance_length, **caching)  # fmt: skip
    try:
        import datasets
    except ImportError as error:
        raise MissingExtraError("--hf-dataset needs 🤗 datasets: pip install datasets") from error
    if not os.path.isdir(args.hf_dataset):
        raise NaturalBiasError(f"--hf-dataset {args.hf_dataset}: no such folder")
    try:
        dataset = datasets.load_from_disk(args.hf_dataset)
    except FileNotFoundError as error:
        raise NaturalBiasError(
            f"--hf-dataset {args.hf_dataset} is not a dataset saved with save_to_disk ({error})"
        ) from None
    if isinstance(dataset, datasets.DatasetDict):
        raise NaturalBiasError(
            f"--hf-dataset {args.hf_dataset} holds splits {list(dataset)}: give one split's folder"
        )
    if args.column not in dataset.column_names:
        raise NaturalBiasError(
            f"--hf-dataset {args.hf_dataset} has no column {args.column!r} (it has "
            f"{dataset.column_names}): give --column"
        )
    return count_dataset(dataset, args.vocab_size, args.column, causal=args.causal, **caching)


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.tokens or args.hf_dataset:
            counts, symbols = count_ids_of(args), None
        else:
            symbols, counts = engine("count", "fairseq")(args)
        write_counts_file(args.output, symbols, counts)
    except (NaturalBiasError, MissingExtraError, OSError) as error:
        sys.exit(f"{PROG}: error: {error}")
    print(f"{PROG}: {int(counts.sum())} tokens over {len(counts)} ids written to {args.output}")


if __name__ == "__main__":
    main()
