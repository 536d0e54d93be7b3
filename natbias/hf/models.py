"""The natural-bias class of any transformers generator, made from its stock
class rather than written out per family.

For a stock class ``X`` (``Qwen2ForCausalLM``, ``MarianMTModel``, ...),
:func:`natural_bias_class` makes ``NaturalBiasX(NaturalBiasModel, X)`` and
its configuration ``NaturalBiasXConfig(XConfig)`` with the model type
``natbias-<x's model type>``. They differ from ``X`` in the output layer
alone (:class:`NaturalBiasModel`); where b sits, per family, and why the
model type is new: docs/huggingface.md.
"""

from typing import Optional

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from natbias import FORMAT_VERSION
from natbias.errors import NaturalBiasError
from natbias.head import check_format_version
from natbias.hf._compat import InitWeights, replicate_in_tp_plan
from natbias.hf.logit_map import map_bias
from natbias.projection import KeepsFloat32, NaturalBiasProjection
from natbias.sharding import fill_, full
from natbias.subclasses import natural_bias_subclass, stock_name

SETTINGS = "natural_bias"  # the configuration's key
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
    check_format_version(settings.get("format_version"), "this model", required=True)
    return settings


class NaturalBiasModel(InitWeights, KeepsFloat32):
    """Mixin placed before a transformers model class: the natural-bias
    output layer, installed after the model's own ``__init__`` (loading) or
    on a model that exists (:func:`natbias.hf.add_natural_bias`, in place)."""

    float32_parameters = (FINAL_LOGITS_BIAS,)
    float32_buffers = ("natbias_log_prior",)
    natbias_stock_class: type = None  # set on each made class

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        settings = natural_bias_settings(config)
        self._install_natural_bias(settings)
        if settings["format_version"] == 1:  # its gain was saved 0-d: loaded as such, then upgraded
            head = self.get_output_embeddings()
            if getattr(head, "gain_param", None) is not None:
                head.gain_param = nn.Parameter(head.gain_param.detach().reshape(()))

    @classmethod
    def from_pretrained(cls, path, *args, **kwargs):
        """transformers' own, then a format-1 model's gain reshaped to format 2's (1,)."""
        if kwargs.get("tp_plan") or kwargs.get("device_mesh"):
            config = kwargs.get("config") or AutoConfig.from_pretrained(path)
            if natural_bias_settings(config)["format_version"] == 1:
                raise NaturalBiasError(
                    "a model saved by natbias 2.0 or earlier (format 1) loads on one process "
                    "only: load it without tp_plan and save_pretrained it again to shard it"
                )
        model = super().from_pretrained(path, *args, **kwargs)
        head = model.get_output_embeddings()
        head.awaiting_values = False  # loaded
        settings = getattr(model.config, SETTINGS)
        if settings["format_version"] == 1:
            if getattr(head, "gain_param", None) is not None:
                head.gain_param = nn.Parameter(head.gain_param.detach().reshape(1))
            settings["format_version"] = FORMAT_VERSION
        return model

    def _install_natural_bias(
        self,
        settings: dict,
        bias: Optional[torch.Tensor] = None,
        log_prior: Optional[torch.Tensor] = None,
    ) -> None:
        """Wraps the head and makes b a parameter; ``bias`` and ``log_prior``:
        their values (zeros when loading, which then fills them). On the meta
        device they wait, on the CPU, for :meth:`init_natural_bias`."""
        head = self.get_output_embeddings()
        weight = head.weight
        vocab_size = weight.shape[0]
        zeros = torch.zeros(vocab_size, dtype=torch.float32, device="cpu")  # not transformers' meta
        bias = zeros if bias is None else bias.detach().to("cpu", torch.float32)
        log_prior = zeros if log_prior is None else log_prior.detach().to("cpu", torch.float32)
        self.natbias_initial_values = {"natbias_log_prior": log_prior}
        if FINAL_LOGITS_BIAS in self._buffers:
            self.natbias_slot = FINAL_LOGITS_BIAS
            del self._buffers[FINAL_LOGITS_BIAS]
            self.natbias_initial_values[FINAL_LOGITS_BIAS] = bias.reshape(1, -1)
            self.register_parameter(
                FINAL_LOGITS_BIAS, nn.Parameter(bias.reshape(1, -1).to(weight.device, copy=True))
            )
            bias = None  # added by the stock forward, through the property below
        else:
            self.natbias_slot = "head" if head.bias is not None else None
        head = NaturalBiasProjection(
            weight, bias, settings.get("gain_init"), settings.get("gain_speed")
        )
        self.set_output_embeddings(head)
        # transformers' tensor parallelism gives a module's style to each of its
        # parameters: the head's would split the one-entry gain by the vocabulary.
        # The gain is kept whole on every process instead.
        names = [name for name, module in self.named_modules() if module is head]
        if head.gain_speed is not None and names:
            replicate_in_tp_plan(self, names[0], "gain_param")
        # log p of the training targets: for the statistics, the criterion and λ·b.
        self.register_buffer("natbias_log_prior", log_prior.to(weight.device, copy=True))
        self.natbias_logit_map = settings.get("logit_map")

    def init_natural_bias(self, module):
        """After transformers' initialisation of ``module`` (``init_weights``,
        after ``to_empty`` for a model built on the meta device; keys missing
        from a saved model), the stock class's: b, the gain and the prior set
        to their initial values, not to a Linear's zero bias."""
        if module is self.get_output_embeddings():
            module.reset_parameters()
        if module is self:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """The prior (and b where the stock class adds it after the head) to
        their initial values; called by :meth:`init_natural_bias`, and by FSDP1's
        default ``param_init_fn`` on a model built on the meta device."""
        for name, values in self.natbias_initial_values.items():
            tensor = self._parameters.get(name)
            fill_(self._buffers[name] if tensor is None else tensor, values)

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
        """b, one entry per vocabulary entry (a view of the parameter; whole,
        gathered on every process, where FSDP shards its (1, |V|) slot)."""
        if self.natbias_slot == FINAL_LOGITS_BIAS:
            return full(self._parameters[FINAL_LOGITS_BIAS]).view(-1)
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


def set_class(model, model_class: type, config_class: type) -> None:
    """natbias.hf's one change of a live object's class, the model's and its
    configuration's: a model the user built (transformers has no hook into it)
    made its natural-bias class by add_natural_bias, and back by to_stock."""
    model.__class__, model.config.__class__ = model_class, config_class


def natural_bias_config_class(stock_config_class: type) -> type:
    """``NaturalBias<Config>``: the stock configuration with the model type
    ``natbias-<its model type>``."""
    if stock_config_class.model_type.startswith(TYPE_PREFIX):
        return stock_config_class
    model_type = TYPE_PREFIX + stock_config_class.model_type
    return natural_bias_subclass(
        stock_config_class, None, __module__=__name__, model_type=model_type
    )


def natural_bias_class(stock_class: type) -> type:
    """``NaturalBias<X>`` for a transformers model class ``X``, made once."""
    if issubclass(stock_class, NaturalBiasModel):
        return stock_class
    config_class = natural_bias_config_class(stock_class.config_class)
    made = natural_bias_subclass(
        stock_class, NaturalBiasModel, config_class=config_class, natbias_stock_class=stock_class
    )
    if stock_class.__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        # The Trainer shifts label_smoothing_factor's labels for the
        # causal LMs this table names, as it does for the stock class.
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config_class.model_type] = made.__name__
    return made


def __getattr__(name: str):
    """``NaturalBias<X>`` made on first use, for instance when a pickle names
    it in a process that has not made it yet."""
    import transformers

    stock = getattr(transformers, stock_name(name) or "", None)
    if isinstance(stock, type):
        if issubclass(stock, PreTrainedModel):
            return natural_bias_class(stock)
        if issubclass(stock, PretrainedConfig):
            return natural_bias_config_class(stock)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
