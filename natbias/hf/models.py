"""Transformers models with the natural bias, their configurations, and their
registration with transformers' ``Auto*`` classes.

Each supported transformers model has a subclass here that differs in its
output layer alone (:class:`NaturalBiasModel`):

* encoder-decoders with ``final_logits_bias`` (Marian, BART): that buffer,
  a zero vector transformers never trains, becomes a trainable parameter
  holding b; ``lm_head`` gets the gain g on W phi;
* decoders whose head has no bias (GPT-2, Llama): ``lm_head`` gets a
  trainable bias b and the gain.

W stays the model's own Parameter, so tied embeddings stay tied. The
configuration carries the settings under ``natural_bias`` (a format version
first) and its own ``model_type`` (``natbias-marian``, ...), so a saved model
reloads as what it is through ``AutoModelForSeq2SeqLM`` /
``AutoModelForCausalLM`` once ``natbias.hf`` is imported, and without that
import transformers refuses the unknown model type instead of loading a
stock model that silently lacks the bias and the gain.
"""

from typing import Optional

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from natbias import FORMAT_VERSION, __version__
from natbias.errors import NaturalBiasError
from natbias.projection import NaturalBiasProjection

SETTINGS = "natural_bias"  # the configuration's key


def natural_bias_settings(config) -> dict:
    """The natural-bias settings a configuration records, checked."""
    settings = getattr(config, SETTINGS, None)
    if not isinstance(settings, dict):
        raise NaturalBiasError(
            f"{type(config).__name__} records no '{SETTINGS}' settings: give "
            "a model the natural bias with natbias.hf.add_natural_bias"
        )
    version = settings.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise NaturalBiasError(
            f"this model's natural bias has format version {version!r}; "
            f"natbias {__version__} reads version {FORMAT_VERSION}: upgrade "
            "natbias to load it"
        )
    return settings


class NaturalBiasModel:
    """Mixin placed before a transformers model class: the natural-bias
    output layer, built once, after the model's own ``__init__``."""

    # True where transformers adds ``final_logits_bias`` after ``lm_head``.
    bias_in_final_logits = False

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        settings = natural_bias_settings(config)
        head = self.get_output_embeddings()
        vocab_size = head.weight.shape[0]
        if self.bias_in_final_logits:
            # transformers adds final_logits_bias after lm_head; make it trainable.
            bias = self.final_logits_bias.detach().to(torch.float32)
            del self.final_logits_bias
            self.final_logits_bias = nn.Parameter(bias)
        self.set_output_embeddings(
            NaturalBiasProjection(
                head.weight,
                None if self.bias_in_final_logits else torch.zeros(vocab_size),
                settings.get("gain_init"),
                settings.get("gain_speed"),
            )
        )
        # log p of the training targets: for the statistics, the criterion and λ·b.
        self.register_buffer("natbias_log_prior", torch.zeros(vocab_size, dtype=torch.float32))

    def output_bias(self) -> torch.Tensor:
        """b, one entry per vocabulary entry (a view of the parameter)."""
        if self.bias_in_final_logits:
            return self.final_logits_bias.view(-1)
        return self.get_output_embeddings().bias

    def output_gain(self) -> Optional[torch.Tensor]:
        return self.get_output_embeddings().gain()


class NaturalBiasMarianConfig(MarianConfig):
    model_type = "natbias-marian"


class NaturalBiasMarianMTModel(NaturalBiasModel, MarianMTModel):
    config_class = NaturalBiasMarianConfig
    bias_in_final_logits = True


class NaturalBiasBartConfig(BartConfig):
    model_type = "natbias-bart"


class NaturalBiasBartForConditionalGeneration(NaturalBiasModel, BartForConditionalGeneration):
    config_class = NaturalBiasBartConfig
    bias_in_final_logits = True


class NaturalBiasGPT2Config(GPT2Config):
    model_type = "natbias-gpt2"


class NaturalBiasGPT2LMHeadModel(NaturalBiasModel, GPT2LMHeadModel):
    config_class = NaturalBiasGPT2Config


class NaturalBiasLlamaConfig(LlamaConfig):
    model_type = "natbias-llama"


class NaturalBiasLlamaForCausalLM(NaturalBiasModel, LlamaForCausalLM):
    config_class = NaturalBiasLlamaConfig


# transformers class -> its natural-bias class, and which Auto class loads it.
NATURAL_BIAS_CLASSES = {
    MarianMTModel: (NaturalBiasMarianMTModel, AutoModelForSeq2SeqLM),
    BartForConditionalGeneration: (NaturalBiasBartForConditionalGeneration, AutoModelForSeq2SeqLM),
    GPT2LMHeadModel: (NaturalBiasGPT2LMHeadModel, AutoModelForCausalLM),
    LlamaForCausalLM: (NaturalBiasLlamaForCausalLM, AutoModelForCausalLM),
}


_registered = False


def register() -> None:
    """Register the configurations and models with transformers' Auto classes
    (done on ``import natbias.hf``; a second call does nothing)."""
    global _registered
    if _registered:
        return
    _registered = True
    for natbias_class, auto_class in NATURAL_BIAS_CLASSES.values():
        config_class = natbias_class.config_class
        AutoConfig.register(config_class.model_type, config_class)
        auto_class.register(config_class, natbias_class)
        if auto_class is AutoModelForCausalLM:
            # The Trainer shifts the labels of label_smoothing_factor for the
            # causal LMs this table names, as transformers' own models are.
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config_class.model_type] = natbias_class.__name__


def natural_bias_class(model) -> type:
    """The natural-bias class for ``model``; a model it does not support is
    refused, naming what it supports."""
    if isinstance(model, NaturalBiasModel):
        raise NaturalBiasError(f"{type(model).__name__} has the natural bias already")
    entry = NATURAL_BIAS_CLASSES.get(type(model))
    if entry is None:
        supported = ", ".join(cls.__name__ for cls in NATURAL_BIAS_CLASSES)
        raise NaturalBiasError(f"natbias.hf supports {supported}; not {type(model).__name__}")
    return entry[0]
