r"""natbias-count: write a counts file for ``--natbias-init file`` (App. A.7).

From tokenised text (e.g. a large English corpus encoded with the same
SentencePiece model, pieces separated by spaces), counted as fairseq would
binarise it (one EOS per line, unknown pieces as <unk>)::

    natbias-count --dict data-bin/dict.en.txt --text c4.en.tok --output c4.counts

or from a binarised split in a fairseq data directory::

    natbias-count --dict data-bin/dict.en.txt --data data-bin \
        --source-lang de --target-lang en --output train.counts
"""

import argparse
import gzip
import sys

from fairseq_natbias import unigram


def build_parser():
    parser = argparse.ArgumentParser(
        prog="natbias-count", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dict", required=True, help="target dictionary (dict.TGT.txt)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", nargs="+", help="tokenised text file(s), .gz allowed")
    source.add_argument("--data", help="fairseq data directory (binarised)")
    parser.add_argument("--source-lang", help="with --data")
    parser.add_argument("--target-lang", help="with --data")
    parser.add_argument("--split", default="train", help="with --data (default: train)")
    parser.add_argument("--output", required=True, help="counts file to write")
    return parser


def _open_text(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def main(argv=None):
    args = build_parser().parse_args(argv)
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(args.dict)
    try:
        if args.text:
            counts = 0
            for path in args.text:
                with _open_text(path) as lines:
                    counts = counts + unigram.count_text(lines, dictionary)
        else:
            if not (args.source_lang and args.target_lang):
                raise unigram.UnigramError("--data needs --source-lang and --target-lang")
            counts = unigram.count_target_tokens(
                args.data, args.split, args.source_lang, args.target_lang,
                len(dictionary),
            )
    except (unigram.UnigramError, OSError) as error:
        sys.exit(f"natbias-count: error: {error}")
    unigram.write_counts_file(args.output, dictionary, counts)
    print(f"natbias-count: {int(counts.sum())} tokens over {len(dictionary)} "
          f"symbols written to {args.output}")


if __name__ == "__main__":
    main()
