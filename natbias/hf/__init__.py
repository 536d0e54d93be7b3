"""The natural bias in Hugging Face transformers (``pip install fairseq-natbias[hf]``).

``add_natural_bias(model, train_dataset)``   any generator, in place: b = log p of its targets, and the gain
``from_pretrained(path)``                    a saved natural-bias model, reloaded as trained
``to_stock(model)``                          the model as its stock class, b in its own bias slot
``to_ctranslate2(model, output_dir)``        a CTranslate2 model, any family it converts (needs ctranslate2)
``UnigramLabelSmoothingLoss``                label smoothing towards the unigram (``compute_loss_func``)
``BiasStatisticsCallback``                   bias_kl, bias_norm, gain, kl_unigram in the Trainer's logs
``log_bias_statistics(trainer)``             the same, placed where every ``report_to`` integration sees it
``BiasScaleLogitsProcessor``                 lambda * b at generation (Kobayashi et al., 2023)

Importing it makes ``natbias-<type>`` models known to ``AutoConfig``,
``AutoModelForCausalLM`` and ``AutoModelForSeq2SeqLM`` (:mod:`natbias.hf.registry`).
"""

from natbias.hf.callback import BiasStatisticsCallback, log_bias_statistics
from natbias.hf.export import to_stock
from natbias.hf.generation import BiasScaleLogitsProcessor
from natbias.hf.loss import UnigramLabelSmoothingLoss
from natbias.hf.models import NaturalBiasModel, natural_bias_class
from natbias.hf.natural_bias import add_natural_bias, count_targets, from_pretrained
from natbias.hf.registry import install

install()


def to_ctranslate2(model, output_dir, tokenizer=None, quantization=None, **options) -> str:
    """The model (or its saved directory) written as a CTranslate2 model to
    ``output_dir`` (:mod:`natbias.hf.ct2`, imported here when first called:
    ctranslate2 is the [ctranslate2] extra)."""
    from natbias.hf.ct2 import to_ctranslate2 as convert

    return convert(model, output_dir, tokenizer, quantization, **options)


__all__ = [
    "BiasScaleLogitsProcessor",
    "BiasStatisticsCallback",
    "NaturalBiasModel",
    "UnigramLabelSmoothingLoss",
    "add_natural_bias",
    "count_targets",
    "from_pretrained",
    "log_bias_statistics",
    "natural_bias_class",
    "to_ctranslate2",
    "to_stock",
]
