"""natbias-count's fairseq part (the script is natbias.count_cli): counts of
tokenised text as fairseq would binarise it (one EOS per line, unknown pieces
as <unk>), or of a binarised split in a fairseq data directory, over the
target dictionary's symbols. Found through the ``natbias.count`` entry point.
"""

import os

from fairseq_natbias.training_data import count_translation_targets, symbols
from natbias.counts import count_text, open_text
from natbias.errors import NaturalBiasError


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


def count(args):
    """``(symbols, counts)`` of natbias-count's ``--text`` or ``--data``, over ``--dict``."""
    if not args.dict:
        raise NaturalBiasError("--text and --data need --dict (the target dictionary)")
    dictionary = load_dictionary(args.dict)
    if args.text:
        return symbols(dictionary), count_text_files(args.text, dictionary)
    if not (args.source_lang and args.target_lang):
        raise NaturalBiasError("--data needs --source-lang and --target-lang")
    # The ids counted are those of the directory's target dictionary: a --dict
    # with other symbols would mislabel them.
    own = os.path.join(args.data, f"dict.{args.target_lang}.txt")
    if os.path.isfile(own) and load_dictionary(own).symbols != dictionary.symbols:
        raise NaturalBiasError(
            f"--dict {args.dict} is not the target dictionary of {args.data} "
            f"({own} holds other symbols); give --dict {own}"
        )
    counts = count_translation_targets(
        args.data, args.split, args.source_lang, args.target_lang, len(dictionary)
    )
    return symbols(dictionary), counts
