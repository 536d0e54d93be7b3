"""The natural-bias class of any transformers generator, made from its stock
class rather than written out per family.

For a stock class ``X`` (``Qwen2ForCausalLM``, ``MarianMTModel``, ...),
:func:`natural_bias_class` makes ``NaturalBiasX(NaturalBiasModel, X)`` and
its configuration ``NaturalBiasXConfig(XConfig)`` with the model type
``natbias-<x's model type>``. They differ from ``X`` in the output layer
alone (:class:`NaturalBiasModel`), and b sits where the architecture keeps
an output bias:

* ``final_logits_bias`` (Marian, BART, mBART, Pegasus, Blenderbot): that
  buffer, zeros transformers never trains, becomes a trainable parameter;
* the head's own bias (Phi, GPT-J, CodeGen): b replaces it;
* elsewhere (Llama, Qwen, Mistral, Gemma, GPT-2, T5, ...): a new one.

The head becomes a :class:`~natbias.projection.NaturalBiasProjection` around
the model's own W (tied embeddings stay tied) with the gain on W phi. The
configuration records the settings under ``natural_bias`` (a format version
first), so a saved model reloads as what it is through the Auto classes once
``natbias.hf`` is imported (:mod:`natbias.hf.registry`), and without that
import transformers refuses the unknown model type rather than loading a
stock model that silently lacks the bias and the gain.
"""

from typing import Optional

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from natbias import FORMAT_VERSION, __version__
from natbias.errors import NaturalBiasError
from natbias.hf.logit_map import map_bias
from natbias.projection import KeepsFloat32, NaturalBiasProjection

SETTINGS = "natural_bias"  # the configuration's key
CLASS_PREFIX = "NaturalBias"
TYPE_PREFIX = "natbias-"
FINAL_LOGITS_BIAS = "final_logits_bias"


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


class NaturalBiasModel(KeepsFloat32):
    """Mixin placed before a transformers model class: the natural-bias
    output layer, installed after the model's own ``__init__`` (loading) or
    on a model that exists (:func:`natbias.hf.add_natural_bias`, in place).

    b, the gain and the prior stay float32 whatever the model is cast to
    (:class:`~natbias.projection.KeepsFloat32`); b is cast to the logits'
    dtype where it is added, as the fairseq plugin adds it."""

    float32_parameters = (FINAL_LOGITS_BIAS,)
    float32_buffers = ("natbias_log_prior",)
    natbias_stock_class: type = None  # set on each made class

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self._install_natural_bias(natural_bias_settings(config))

    def _install_natural_bias(self, settings: dict, bias: Optional[torch.Tensor] = None) -> None:
        """Wraps the head and makes b a parameter; ``bias``: b's values (zeros
        when loading, which then fills them)."""
        head = self.get_output_embeddings()
        weight = head.weight
        vocab_size = weight.shape[0]
        if bias is None:
            bias = torch.zeros(vocab_size, dtype=torch.float32, device=weight.device)
        bias = bias.detach().to(weight.device, torch.float32)
        if FINAL_LOGITS_BIAS in self._buffers:
            self.natbias_slot = FINAL_LOGITS_BIAS
            del self._buffers[FINAL_LOGITS_BIAS]
            self.register_parameter(FINAL_LOGITS_BIAS, nn.Parameter(bias.reshape(1, -1).clone()))
            bias = None  # added by the stock forward, through the property below
        else:
            self.natbias_slot = "head" if head.bias is not None else None
        self.set_output_embeddings(
            NaturalBiasProjection(
                weight, bias, settings.get("gain_init"), settings.get("gain_speed")
            )
        )
        # log p of the training targets: for the statistics, the criterion and λ·b.
        self.register_buffer(
            "natbias_log_prior", torch.zeros(vocab_size, dtype=torch.float32, device=weight.device)
        )
        self.natbias_logit_map = settings.get("logit_map")

    @property
    def final_logits_bias(self) -> torch.Tensor:
        """What the stock forward adds to the logits: b cast to their dtype
        (the head's, or autocast's). Only where the stock class has one."""
        bias = self._parameters.get(FINAL_LOGITS_BIAS)
        if bias is None:
            buffer = self._buffers.get(FINAL_LOGITS_BIAS)
            if buffer is None:
                raise AttributeError(FINAL_LOGITS_BIAS)
            return buffer
        weight = self.get_output_embeddings().weight
        device = weight.device.type
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        return bias.to(torch.get_autocast_dtype(device) if autocast else weight.dtype)

    def output_bias(self) -> torch.Tensor:
        """b, one entry per vocabulary entry (a view of the parameter)."""
        if self.natbias_slot == FINAL_LOGITS_BIAS:
            return self._parameters[FINAL_LOGITS_BIAS].view(-1)
        return self.get_output_embeddings().bias

    def output_gain(self) -> Optional[torch.Tensor]:
        return self.get_output_embeddings().gain()

    def bias_in_logits(self) -> torch.Tensor:
        """b as the logits see it: f(b) where the model maps its head's
        output (a scale, a soft cap: :mod:`natbias.hf.logit_map`), else b."""
        return map_bias(self.output_bias(), self.natbias_logit_map)

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype, not that of b (kept float32, and listed first
        among the parameters where it is ``final_logits_bias``)."""
        return self.get_output_embeddings().weight.dtype

    def resize_token_embeddings(self, *args, **kwargs):
        raise NaturalBiasError(
            "b and the prior are counted over the vocabulary the model had: "
            "resize the token embeddings before add_natural_bias, not after"
        )

    def _float32_device(self) -> torch.device:
        return self.get_output_embeddings().weight.device


_MADE: dict = {}  # stock class -> its natural-bias class (configurations too)


def natural_bias_config_class(stock_config_class: type) -> type:
    """``NaturalBias<Config>``: the stock configuration with the model type
    ``natbias-<its model type>``."""
    if stock_config_class.model_type.startswith(TYPE_PREFIX):
        return stock_config_class
    made = _MADE.get(stock_config_class)
    if made is None:
        made = _make(
            stock_config_class,
            (stock_config_class,),
            {"model_type": TYPE_PREFIX + stock_config_class.model_type},
        )
    return made


def natural_bias_class(stock_class: type) -> type:
    """``NaturalBias<X>`` for a transformers model class ``X``, made once."""
    if issubclass(stock_class, NaturalBiasModel):
        return stock_class
    made = _MADE.get(stock_class)
    if made is None:
        config_class = natural_bias_config_class(stock_class.config_class)
        attributes = {"config_class": config_class, "natbias_stock_class": stock_class}
        made = _make(stock_class, (NaturalBiasModel, stock_class), attributes)
        if stock_class.__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
            # The Trainer shifts label_smoothing_factor's labels for the
            # causal LMs this table names, as it does for the stock class.
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config_class.model_type] = made.__name__
    return made


def _make(stock: type, bases: tuple, attributes: dict) -> type:
    name = CLASS_PREFIX + stock.__name__
    doc = f"{stock.__name__} with the natural bias (natbias.hf)."
    made = type(name, bases, {"__module__": __name__, "__doc__": doc, **attributes})
    _MADE[stock] = made
    globals()[name] = made  # pickle finds it by name
    return made


def __getattr__(name: str):
    """``NaturalBias<X>`` made on first use, for instance when a pickle names
    it in a process that has not made it yet."""
    import transformers

    stock = None
    if name.startswith(CLASS_PREFIX):
        stock = getattr(transformers, name[len(CLASS_PREFIX) :], None)
    if isinstance(stock, type):
        if issubclass(stock, PreTrainedModel):
            return natural_bias_class(stock)
        if issubclass(stock, PretrainedConfig):
            return natural_bias_config_class(stock)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
