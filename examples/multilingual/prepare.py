"""Raw parallel text as one multilingual data-bin for ``--task
translation_multi_simple_epoch``: one SentencePiece model over every
language's training text, one dictionary (``dict.LANG.txt`` for each
language, all the same), each pair binarised as ``train.SRC-TGT.{SRC,TGT}``.

    python examples/multilingual/prepare.py --raw DIR --pairs en-de,en-fr --out data-bin

DIR holds ``train.LANG``, ``val.LANG``, ``test_2016_flickr.LANG`` (plain or
.gz, line-aligned across languages, as Multi30k). A finished folder is kept.
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
    joined = pieces / "all"
    joined.write_text("".join((pieces / f"train.{lang}").read_text() for lang in langs))
    _preprocess("--only-source", "--trainpref", joined, "--destdir", out / "dict")
    for src, tgt in pairs:
        prefixes = [f"--{s}pref" for s in ("train", "valid", "test")]
        _preprocess(
            "--source-lang", src, "--target-lang", tgt, "--destdir", out,
            *itertools.chain(*zip(prefixes, (pieces / s for s in SPLITS))),
            "--srcdict", out / "dict/dict.txt", "--tgtdict", out / "dict/dict.txt",
        )  # fmt: skip
    for lang in langs:
        shutil.copy(out / "dict/dict.txt", out / f"dict.{lang}.txt")
    (out / ".done").touch()
    return out


def _preprocess(*args) -> None:
    """fairseq-preprocess ARGS, in this process (no second start of torch and fairseq)."""
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    preprocess.main(parser.parse_args(["--workers", "1", *map(str, args)]))


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
