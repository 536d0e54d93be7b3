"""A ``transformer_natbias`` or ``transformer_lm_natbias`` checkpoint as a
CTranslate2 model, by CTranslate2's own :class:`FairseqConverter`.

The two models are fairseq's ``transformer`` and ``transformer_lm`` with one
output layer changed, ``W (g phi) + b``, which CTranslate2's specification
holds exactly: its decoder's output projection has an optional bias (b), and
g goes into the projection's weight (g W; the tied embeddings keep W). So the
converter is CTranslate2's, told the stock model name for the architecture
(its check goes by name). The bigram residual of ``--natbias-order 2`` adds
a row of a table per previous token, which no CTranslate2 layer does: refused.
"""

import contextlib

import numpy as np

from fairseq_natbias.checkpoint_loading import read_checkpoint, saved_model_args
from fairseq_natbias.natural_bias import check_natbias_checkpoint
from natbias.errors import MissingExtraError, NaturalBiasError
from natbias.projection import NaturalBiasProjection

try:
    from ctranslate2.converters import FairseqConverter
except ImportError as error:
    raise MissingExtraError(
        "converting to CTranslate2 needs ctranslate2: pip install 'fairseq-natbias[ctranslate2]'"
    ) from error

STOCK_MODEL = {"transformer_natbias": "transformer", "transformer_lm_natbias": "transformer_lm"}
GAIN_KEY = "decoder.output_projection.gain_param"


class NaturalBiasFairseqConverter(FairseqConverter):
    """``FairseqConverter`` for the plugin's checkpoints; the same arguments."""

    def _load(self):
        arch, _ = check_natbias_checkpoint(self._model_path)
        saved = saved_model_args(self._model_path)
        if getattr(saved, "natbias_order", 1) == 2:
            raise NaturalBiasError(
                f"{self._model_path} was trained with --natbias-order 2, whose bigram "
                "residual (a learnt row per previous token) no CTranslate2 layer computes: "
                "only --natbias-order 1 models can be served"
            )
        with _read_as_stock(arch):
            spec = super()._load()
        gain = saved_gain(read_checkpoint(self._model_path)["model"], saved)
        if gain != 1.0:  # a new array: the embeddings, tied or not, keep W
            projection = spec.decoder.projection
            projection.weight = projection.weight * np.float32(gain)
        return spec


@contextlib.contextmanager
def _read_as_stock(arch: str):
    """CTranslate2 picks its specification by the architecture's model name."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    name = ARCH_MODEL_NAME_REGISTRY[arch]
    ARCH_MODEL_NAME_REGISTRY[arch] = STOCK_MODEL[name]
    try:
        yield
    finally:
        ARCH_MODEL_NAME_REGISTRY[arch] = name


def saved_gain(model_state: dict, saved) -> float:
    """g of a saved model, by the projection's own formula; 1 without a gain."""
    param = model_state.get(GAIN_KEY)
    if param is None:
        return 1.0
    projection = NaturalBiasProjection(param.new_zeros(1, 1), gain_speed=saved.natbias_gain_speed)
    projection.gain_param.data = param.reshape(projection.gain_param.shape).float()
    return float(projection.gain().detach())


def convert_checkpoint(checkpoint: str, data_dir: str, output_dir: str, **options) -> str:
    """Write the CTranslate2 model of ``checkpoint`` (its dictionaries in
    ``data_dir``) to ``output_dir``; ``options``: ``quantization``, ``force``,
    ``vmap`` (those of ``Converter.convert``), ``source_lang``, ``target_lang``."""
    convert = {key: options.pop(key) for key in ("quantization", "force", "vmap") if key in options}
    converter = NaturalBiasFairseqConverter(checkpoint, data_dir, **options)
    return converter.convert(output_dir, **convert)
