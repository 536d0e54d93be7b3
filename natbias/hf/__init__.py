"""The natural bias in Hugging Face transformers (``pip install fairseq-natbias[hf]``).

``add_natural_bias(model, train_dataset)``   the model with b = log p of its targets and the gain
``from_pretrained(path)``                    a saved natural-bias model, reloaded as trained
``UnigramLabelSmoothingLoss``                label smoothing towards the unigram (``compute_loss_func``)
``BiasStatisticsCallback``                   bias_kl, bias_norm, gain, kl_unigram in the Trainer's logs
``BiasScaleLogitsProcessor``                 lambda * b at generation (Kobayashi et al., 2023)

Importing it registers the natural-bias models with ``AutoConfig``,
``AutoModelForSeq2SeqLM`` and ``AutoModelForCausalLM``.
"""

from natbias.hf.callback import BiasStatisticsCallback
from natbias.hf.generation import BiasScaleLogitsProcessor
from natbias.hf.loss import UnigramLabelSmoothingLoss
from natbias.hf.models import NATURAL_BIAS_CLASSES, NaturalBiasModel, register
from natbias.hf.natural_bias import add_natural_bias, count_targets, from_pretrained

register()

__all__ = [
    "BiasScaleLogitsProcessor",
    "BiasStatisticsCallback",
    "NATURAL_BIAS_CLASSES",
    "NaturalBiasModel",
    "UnigramLabelSmoothingLoss",
    "add_natural_bias",
    "count_targets",
    "from_pretrained",
]
