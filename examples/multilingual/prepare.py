"""Raw parallel text as one multilingual data-bin for ``--task
translation_multi_simple_epoch``: one SentencePiece model over every
language's training text, one dictionary (``dict.LANG.txt`` for each
language, all the same), each pair binarised as ``train.SRC-TGT.{SRC,TGT}``.

    python examples/multilingual/prepare.py --raw DIR --pairs en-de,en-fr --out data-bin

DIR holds ``train.LANG``, ``val.LANG``, ``test_2016_flickr.LANG`` (plain or
.gz, line-aligned across languages, as Multi30k). A finished folder is kept.
:func:`binarise` is the last step alone, for text already encoded (the
multilingual recipe, recipes/multilingual/run.sh, calls it).
"""

import argparse
import itertools
import shutil
import sys
from pathlib import Path

from natbias.counts import open_text
from natbias.tools import sentencepiece_text

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def _raw(raw: Path, split: str, lang: str) -> Path:
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (raw / name).exists():
            return raw / name
    sys.exit(f"prepare.py: error: no {split}.{lang} (or .gz) in {raw}: give --raw DIR")


def _write_slice(source: Path, target: Path, lines) -> None:
    with open_text(str(source)) as text:
        target.write_text("".join(itertools.islice(text, lines)), encoding="utf-8")


def prepare(raw, out, pairs, train_lines=None, eval_lines=None, vocab_size=4000) -> Path:
    """Binarise ``pairs`` (``[("en", "de"), ...]``) into ``out``; returns it."""
    raw, out = Path(raw), Path(out)
    if (out / ".done").exists():
        return out
    langs = sorted({lang for pair in pairs for lang in pair})
    text, pieces = out / "text", out / "pieces"
    for folder in (text, pieces):
        folder.mkdir(parents=True, exist_ok=True)
    for (split, name), lang in itertools.product(SPLITS.items(), langs):
        _write_slice(
            _raw(raw, name, lang), text / f"{split}.{lang}",
            train_lines if split == "train" else eval_lines,
        )  # fmt: skip
    sentencepiece_text.train([text / f"train.{lang}" for lang in langs], out / "spm", vocab_size)
    sentencepiece_text.encode_files(out / "spm.model", sorted(text.iterdir()), pieces)
    binarise({tuple(pair): pieces for pair in pairs}, out)
    (out / ".done").touch()
    return out


def binarise(pieces, out, tests=("test",), workers=1) -> None:
    """One dictionary over the training text of every pair, and each pair
    binarised into ``out`` with it (``dict.LANG.txt`` for each language), and
    ``langs.txt``, the languages for ``--lang-dict`` (their tokens' order then
    does not depend on ``--lang-pairs``).
    ``pieces`` maps ``(src, tgt)`` to the folder of its encoded text,
    ``{train,valid,<tests>}.LANG`` (the recipes keep one folder per corpus);
    ``tests`` become fairseq's splits test, test1, ..."""
    out = Path(out)
    train = dict.fromkeys(Path(d) / f"train.{lang}" for pair, d in pieces.items() for lang in pair)
    joined = out / "dict" / "train.all"
    joined.parent.mkdir(parents=True, exist_ok=True)
    joined.write_text("".join(path.read_text(encoding="utf-8") for path in train), encoding="utf-8")
    _preprocess(workers, "--only-source", "--trainpref", joined, "--destdir", out / "dict")
    dictionary = out / "dict" / "dict.txt"
    for (src, tgt), folder in pieces.items():
        folder = Path(folder)
        _preprocess(
            workers, "--source-lang", src, "--target-lang", tgt, "--destdir", out,
            "--trainpref", folder / "train", "--validpref", folder / "valid",
            "--testpref", ",".join(str(folder / name) for name in tests),
            "--srcdict", dictionary, "--tgtdict", dictionary,
        )  # fmt: skip
    langs = sorted({lang for pair in pieces for lang in pair})
    for lang in langs:
        shutil.copy(dictionary, out / f"dict.{lang}.txt")
    (out / "langs.txt").write_text("".join(f"{lang}\n" for lang in langs), encoding="utf-8")
    joined.unlink()


def _preprocess(workers, *args) -> None:
    """fairseq-preprocess's own parser and main, in this process: one import
    of fairseq for every pair."""
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    preprocess.main(parser.parse_args(["--workers", str(workers), *map(str, args)]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", required=True, type=Path, help="folder of raw text")
    parser.add_argument("--pairs", required=True, help="SRC-TGT,SRC-TGT,...")
    parser.add_argument("--out", required=True, type=Path, help="the data-bin to write")
    parser.add_argument("--train-lines", type=int, help="the first N training lines (all)")
    parser.add_argument("--eval-lines", type=int, help="the first N valid/test lines (all)")
    parser.add_argument("--vocab-size", type=int, default=4000, help="SentencePiece pieces")
    args = parser.parse_args(argv)
    pairs = [tuple(pair.split("-")) for pair in args.pairs.split(",")]
    prepare(args.raw, args.out, pairs, args.train_lines, args.eval_lines, args.vocab_size)


if __name__ == "__main__":
    main()
