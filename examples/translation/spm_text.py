"""SentencePiece for the examples, through the `sentencepiece` Python module
(its pip package has no spm_train / spm_encode binaries).

    python spm_text.py train --model-prefix WORK/spm --vocab-size 8000 \\
        WORK/raw/train.de WORK/raw/train.en
    python spm_text.py encode --model WORK/spm.model --output-dir WORK/spm \\
        WORK/raw/*.de WORK/raw/*.en

train: one unigram model over all the given files (joint when they are two
languages); encode: each file's lines as space-separated pieces, written
under the same name in --output-dir (what fairseq-preprocess reads).
"""

import argparse
import os
import sys


def train(files, model_prefix, vocab_size):
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        input=",".join(files), model_prefix=model_prefix, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0,
        # fairseq's dictionary adds its own <s> </s> <pad>; <unk> stays id 0.
        bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
        # small corpora may have fewer pieces than asked for: take what there is
        hard_vocab_limit=False, minloglevel=2,
    )


def encode(files, model, output_dir):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=model)
    os.makedirs(output_dir, exist_ok=True)
    for path in files:
        with open(path, encoding="utf-8") as lines:
            pieces = [" ".join(processor.encode(line.rstrip("\n"), out_type=str)) for line in lines]
        with open(os.path.join(output_dir, os.path.basename(path)), "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in pieces)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="spm_text.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("train", help="train one model on the files")
    trainer.add_argument("--model-prefix", required=True)
    trainer.add_argument("--vocab-size", type=int, required=True)
    trainer.add_argument("files", nargs="+")
    encoder = commands.add_parser("encode", help="encode the files into --output-dir")
    encoder.add_argument("--model", required=True)
    encoder.add_argument("--output-dir", required=True)
    encoder.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    missing = [path for path in args.files + ([args.model] if args.command == "encode" else [])
               if not os.path.isfile(path)]
    if missing:
        sys.exit(f"spm_text.py: error: no such file: {missing[0]}")
    if args.command == "train":
        train(args.files, args.model_prefix, args.vocab_size)
    else:
        encode(args.files, args.model, args.output_dir)


if __name__ == "__main__":
    main()
