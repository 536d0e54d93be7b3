"""``transformer_natbias`` and ``transformer_lm_natbias`` checkpoints as CTranslate2
models by CTranslate2's FairseqConverter, read as the stock models they extend (its
check goes by model name): b is the output projection's bias, and the gain is folded
into its weight (g W, a new array: tied embeddings keep W). The bigram residual of
--natbias-order 2 is computed by no CTranslate2 layer, nor a bias row per target
language (--natbias-prior per-language) by its one projection bias: both refused.
"""

import os

from ctranslate2.converters import FairseqConverter

from fairseq_natbias._compat import LoadSpec, arch_read_as
from fairseq_natbias.checkpoint_loading import read_checkpoint, saved_model_args
from fairseq_natbias.natural_bias import check_natbias_checkpoint
from fairseq_natbias.options import LANGUAGE_TOKENS
from natbias.errors import NaturalBiasError
from natbias.head import fold_gain, gain

STOCK_MODEL = {"transformer_natbias": "transformer", "transformer_lm_natbias": "transformer_lm"}


class NaturalBiasFairseqConverter(LoadSpec, FairseqConverter):
    """``FairseqConverter`` (the same arguments) for the plugin's checkpoints."""

    def __init__(self, model_path, data_dir, **options):
        super().__init__(model_path, data_dir, **options)
        self.checkpoint = model_path

    def load_spec(self, stock_load):
        arch, _ = check_natbias_checkpoint(self.checkpoint)
        saved = saved_model_args(self.checkpoint)
        if getattr(saved, "natbias_order", 1) == 2:
            raise NaturalBiasError(
                f"{self.checkpoint} has the bigram residual of --natbias-order 2, which no "
                "CTranslate2 layer computes: only --natbias-order 1 models can be served"
            )
        if getattr(saved, LANGUAGE_TOKENS, None):
            raise NaturalBiasError(
                f"{self.checkpoint} has one bias row per target language (--natbias-prior "
                "per-language), chosen per sentence, which a CTranslate2 model's one projection "
                "bias cannot hold: serve it with fairseq, or train with --natbias-prior pooled"
            )
        with arch_read_as(arch, STOCK_MODEL):  # the model name CTranslate2 checks
            spec = stock_load()
        state = read_checkpoint(self.checkpoint)["model"]
        param = state.get("decoder.output_projection.gain_param")  # u; None without a gain
        g = 1.0 if param is None else gain(param.float(), saved.natbias_gain_speed).item()
        spec.decoder.projection.weight = fold_gain(spec.decoder.projection.weight, g)
        return spec


def to_ctranslate2(model_path, output_dir, data_dir, quantization=None, **options) -> str:
    """natbias-ct2-converter's fairseq branch (the ``natbias.ct2`` entry point ``fairseq``):
    the checkpoint file ``model_path`` (its dictionaries in ``data_dir``) written to ``output_dir``."""
    converter = NaturalBiasFairseqConverter(os.fspath(model_path), os.fspath(data_dir))
    return converter.convert(os.fspath(output_dir), quantization=quantization, **options)
