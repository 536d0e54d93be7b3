"""SentencePiece for the examples, through the `sentencepiece` Python module
(its pip package has no spm_train / spm_encode binaries).

    python spm_text.py train --model-prefix WORK/spm --vocab-size 8000 \\
        WORK/raw/train.de WORK/raw/train.en
    python spm_text.py encode --model WORK/spm.model --output-dir WORK/spm \\
        WORK/raw/*.de WORK/raw/*.en

train: one unigram model over all the given files (joint when they are two
languages); encode: each file's lines as space-separated pieces, written
under the same name in --output-dir (what fairseq-preprocess reads). Both are
natbias.tools.sentencepiece_text's, the demo's and the recipes' too (no torch,
no fairseq).
"""

import os
import sys

from natbias.tools.cli import parser_for


def main(argv=None):
    parser = parser_for("spm_text.py", __doc__)
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
    missing = [
        path
        for path in args.files + ([args.model] if args.command == "encode" else [])
        if not os.path.isfile(path)
    ]
    if missing:
        sys.exit(f"spm_text.py: error: no such file: {missing[0]}")
    # The package's one SentencePiece trainer and encoder, which the demo and
    # the recipes use too.
    from natbias.tools import sentencepiece_text

    if args.command == "train":
        sentencepiece_text.train(args.files, args.model_prefix, args.vocab_size)
    else:
        sentencepiece_text.encode_files(args.model, args.files, args.output_dir)


if __name__ == "__main__":
    main()
