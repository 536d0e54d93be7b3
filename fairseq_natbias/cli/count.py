r"""natbias-count: write a counts file for ``--natbias-init file`` (App. A.7), from
tokenised text counted as fairseq would binarise it (one EOS per line, unknown
pieces as <unk>)::

    natbias-count --dict data-bin/dict.en.txt --text c4.en.tok --output c4.counts

or from a binarised split in a fairseq data directory::

    natbias-count --dict data-bin/dict.en.txt --data data-bin \
        --source-lang de --target-lang en --output train.counts
"""

import os
import sys

from fairseq_natbias.training_data import count_translation_targets, symbols
from natbias.counts import count_text, open_text, write_counts_file
from natbias.errors import NaturalBiasError
from natbias.tools.cli import parser_for


def build_parser():
    parser = parser_for("natbias-count", __doc__)
    parser.add_argument("--dict", required=True, help="target dictionary (dict.TGT.txt)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", nargs="+", help="tokenised text file(s), .gz allowed")
    source.add_argument("--data", help="fairseq data directory (binarised)")
    parser.add_argument("--source-lang", help="with --data")
    parser.add_argument("--target-lang", help="with --data")
    parser.add_argument("--split", default="train", help="with --data (default: train)")
    parser.add_argument("--output", required=True, help="counts file to write")
    return parser


def load_dictionary(path):
    """fairseq's Dictionary of ``path``; anything else is refused by name."""
    from fairseq.data import Dictionary

    if not os.path.isfile(path):
        raise NaturalBiasError(
            f"--dict {path}: no such file; give the target "
            "dictionary, dict.TGT.txt of the fairseq data directory"
        )
    try:
        return Dictionary.load(path)
    except Exception as error:  # fairseq: ValueError for a bad line, Exception for bad bytes
        raise NaturalBiasError(
            f"--dict {path} is not a fairseq dictionary ({str(error).splitlines()[0]}); "
            "give dict.TGT.txt of the fairseq data directory"
        ) from None


def count_text_files(paths, dictionary):
    counts = 0
    for path in paths:
        try:
            with open_text(path) as lines:
                counts = counts + count_text(
                    lines, dictionary.index, dictionary.eos(), len(dictionary)
                )
        except UnicodeDecodeError as error:
            raise NaturalBiasError(
                f"--text {path} is not UTF-8 text (byte {error.start}); give tokenised "
                "text, one sentence a line"
            ) from None
    return counts


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        dictionary = load_dictionary(args.dict)
        if args.text:
            counts = count_text_files(args.text, dictionary)
        else:
            if not (args.source_lang and args.target_lang):
                raise NaturalBiasError("--data needs --source-lang and --target-lang")
            # The ids counted are those of the directory's target dictionary:
            # a --dict with other symbols would mislabel them.
            own = os.path.join(args.data, f"dict.{args.target_lang}.txt")
            if os.path.isfile(own) and load_dictionary(own).symbols != dictionary.symbols:
                raise NaturalBiasError(
                    f"--dict {args.dict} is not the target dictionary of {args.data} "
                    f"({own} holds other symbols); give --dict {own}"
                )
            counts = count_translation_targets(
                args.data, args.split, args.source_lang, args.target_lang, len(dictionary)
            )
    except (NaturalBiasError, OSError) as error:
        sys.exit(f"natbias-count: error: {error}")
    write_counts_file(args.output, symbols(dictionary), counts)
    print(
        f"natbias-count: {int(counts.sum())} tokens over {len(dictionary)} "
        f"symbols written to {args.output}"
    )


if __name__ == "__main__":
    main()
