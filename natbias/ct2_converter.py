"""natbias-ct2-converter: a natural-bias model of either framework as a CTranslate2
model (the options are ct2-*-converter's; docs/deployment.md)::

    natbias-ct2-converter --model_path checkpoint_best.pt --data_dir data-bin --output_dir ct2
    natbias-ct2-converter --model saved_natbias_hf_model --output_dir ct2 --quantization int8

Each engine's converter is found through the ``natbias.ct2`` entry points
(natbias.tools.cli.engine): this module imports no engine, and a user of one
needs not the other.
"""

import os
import sys

from natbias.errors import MissingExtraError, NaturalBiasError
from natbias.tools.cli import engine, parser_for

PROG = "natbias-ct2-converter"
NO_CT2 = "CTranslate2 is not installed: pip install 'fairseq-natbias[ctranslate2]'"


def convert(model, output_dir, data_dir=None, tokenizer=None, quantization=None, **options) -> str:
    """Write to ``output_dir`` the CTranslate2 model of ``model``: a fairseq checkpoint
    file (``data_dir``: its dictionaries), a natbias.hf model (``tokenizer``: its
    tokenizer) or its directory. ``options``: ``force``, ``vmap``."""
    if isinstance(model, (str, os.PathLike)) and os.path.isfile(model):
        if data_dir is None:
            raise NaturalBiasError(f"{model} is a fairseq checkpoint: give its data directory")
        to_ctranslate2 = engine("ct2", "fairseq")
        return to_ctranslate2(model, output_dir, data_dir, quantization, **options)
    to_ctranslate2 = engine("ct2", "transformers")
    return to_ctranslate2(model, os.fspath(output_dir), tokenizer, quantization, **options)


def build_parser():
    try:
        from ctranslate2.converters import Converter
    except ImportError as error:
        raise MissingExtraError(NO_CT2) from error
    parser = parser_for(PROG, __doc__)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model_path", help="fairseq: the checkpoint file")
    model.add_argument("--model", help="transformers: the saved model's directory")
    parser.add_argument("--data_dir", help="fairseq: the data directory (its dictionaries)")
    return Converter.declare_arguments(parser)  # --output_dir, --quantization, --force, ...


def main(argv=None):
    try:
        args = build_parser().parse_args(argv)
        if args.model_path is not None and not os.path.isfile(args.model_path):
            raise NaturalBiasError(f"--model_path {args.model_path}: no such checkpoint file")
        if os.path.exists(args.output_dir) and not args.force:
            raise NaturalBiasError(f"{args.output_dir} exists: give --force to replace it")
        model, vmap = args.model_path or args.model, args.vocab_mapping
        options = dict(quantization=args.quantization, force=args.force, vmap=vmap)
        written = convert(model, args.output_dir, args.data_dir, **options)
    except (NaturalBiasError, MissingExtraError, OSError) as error:
        sys.exit(f"{PROG}: error: {error}")
    print(f"{PROG}: wrote {written}")
