"""vLLM's class of each family with the natural bias: ``NaturalBias<X>`` is
``(NaturalBiasCausalLM, X)`` for vLLM's own class ``X`` of the stock
architecture (``LlamaForCausalLM``, ``Gemma2ForCausalLM``, ...), made when
vLLM first asks for it, as :mod:`natbias.hf.models` makes the transformers one.

It differs from ``X`` in the logits alone. ``X`` computes them as
``logits_processor(head, phi)``: a matrix product with the head, then the
family's soft cap (Gemma 2) or logit scale (Cohere). The mixin makes that
layer's product ``W (g phi) + b`` (:class:`NaturalBiasLogits`), before the
soft cap or scale: b sharded by the vocabulary as the head is (GPT-J's own
head bias is b), g on phi so that a tied head stays tied.

A saved architecture whose stock class vLLM has no class of its own for is
refused in one line saying why (:func:`refusal_of`), when vLLM looks it up.
vLLM's private names are :mod:`natbias.vllm._compat`'s.
"""

import torch
from torch import nn

from natbias import head
from natbias.errors import NaturalBiasError
from natbias.hf.models import natural_bias_settings
from natbias.subclasses import PREFIX, natural_bias_subclass, stock_name
from natbias.vllm._compat import (
    TEXT_GENERATION_MODELS,
    HeadProduct,
    InProcess,
    ModelRegistry,
    load_model_class,
    rebuilt,
    refuse_in_registry,
)

# The keys natbias.hf saves beside the stock model's.
BIAS, GAIN, PRIOR = "lm_head.bias", "lm_head.gain_param", "natbias_log_prior"


class NaturalBiasLogits(HeadProduct):
    """Mixin placed before the stock class's ``LogitsProcessor`` (built in
    the model's ``__init__`` in its place): its matrix product with the head takes
    ``g phi`` and adds b, before its soft cap and scale."""

    def install(self, head: nn.Module, own_bias: bool, gain_speed, dtype) -> None:
        self.natbias_bias = None
        if own_bias:  # one entry per vocabulary entry of this shard, padding 0
            self.natbias_bias = nn.Parameter(
                torch.zeros(head.num_embeddings_per_partition, dtype=dtype), requires_grad=False
            )
            self.natbias_bias.output_dim = 0
            self.natbias_bias.weight_loader = head.weight_loader
        self.natbias_gain_param = None
        if gain_speed is not None:
            self.natbias_gain_param = nn.Parameter(torch.zeros(1), requires_grad=False)
            self.natbias_gain_param.weight_loader = _copy
        self.natbias_gain_speed = gain_speed
        self.natbias_gain = None  # g, set once loaded

    def head_product(self, product, hidden_states):
        if self.natbias_gain is not None:
            hidden_states = hidden_states * self.natbias_gain.to(hidden_states.dtype)
        logits = product(hidden_states)
        if self.natbias_bias is None:
            return logits
        # Added to the product, not given to it: vLLM's CPU kernels for a
        # small head want a bias of another dtype than its larger ones do.
        return logits + self.natbias_bias.to(logits.dtype)


def natural_bias_logits(stock: nn.Module, head: nn.Module, own_bias: bool, gain_speed, dtype):
    """The natural-bias logits layer, built as vLLM built the stock ``LogitsProcessor``."""
    layer = rebuilt(stock, natural_bias_subclass(type(stock), NaturalBiasLogits))
    layer.install(head, own_bias, gain_speed, dtype)
    return layer


def _copy(param: nn.Parameter, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded.reshape(param.shape))


class NaturalBiasCausalLM:
    """Mixin placed before a vLLM causal language model class."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        settings = natural_bias_settings(vllm_config.model_config.hf_config)
        head = _head(self)
        stock_bias = getattr(head, "bias", None) is not None  # GPT-J's: b is the stock bias
        self.logits_processor = natural_bias_logits(
            self.logits_processor,
            head,
            own_bias=not stock_bias,
            gain_speed=settings.get("gain_speed"),
            dtype=vllm_config.model_config.dtype,
        )

    def load_weights(self, weights):
        logits = self.logits_processor
        kept = {}

        def stock_weights():
            for name, tensor in weights:
                if name in (PRIOR, GAIN) or (name == BIAS and logits.natbias_bias is not None):
                    kept[name] = tensor
                else:
                    yield name, tensor

        loaded = set(super().load_weights(stock_weights()))
        for key, param in ((BIAS, logits.natbias_bias), (GAIN, logits.natbias_gain_param)):
            if param is None:
                continue
            if key not in kept:
                raise NaturalBiasError(
                    f"the checkpoint has no {key}: it was not saved by natbias.hf "
                    "(save_pretrained of a model given add_natural_bias)"
                )
            param.weight_loader(param, kept[key].to(param.dtype))
            loaded.add(next(name for name, p in self.named_parameters() if p is param))
        if logits.natbias_gain_param is not None:  # g in float32, as transformers computes it
            logits.natbias_gain = head.gain(
                logits.natbias_gain_param.float(), logits.natbias_gain_speed
            )
        return loaded


def _head(model: nn.Module) -> nn.Module:
    """The module whose weight is W: the stock head, else the embeddings
    (tied heads of Gemma 2 and Cohere use them directly); either is sharded
    by the vocabulary alike."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    for module in (getattr(model, "lm_head", None), *model.modules()):
        if isinstance(module, VocabParallelEmbedding):
            return module
    raise NaturalBiasError(f"{type(model).__name__} has no vocabulary-parallel head in vLLM")


# Why a natural-bias generator is refused: vLLM's registry has no class for
# its stock architecture; or it has only its Transformers backend, whose
# logits layer takes b and g as vLLM's own classes do, but which builds some
# families otherwise than transformers (a natural-bias GPT-NeoX, whose
# configuration is not "gpt_neox", leaves transformers' tokens from the 4th):
# served there are the families tested token-identical with transformers.
WHY_NOT = {
    "seq2seq": "vLLM runs no sequence-to-sequence class of this family",
    "causal": "vLLM's registry has no class for it, of its own or through its Transformers backend",
    "backend": (
        "vLLM runs it through its Transformers backend, where natbias.vllm serves only the "
        "families tested token-identical with transformers"
    ),
}
# Served through vLLM's Transformers backend (tests/test_vllm.py): what
# natbias.olmo_core.to_hf writes (Olmo 2), and Phi.
BACKEND_SERVED = {"Olmo2ForCausalLM", "PhiForCausalLM"}


def refusal(stock_name: str, why: str) -> str:
    import vllm

    instead = (
        "natbias.hf.to_stock exports it, with b in its own bias slot, for engines that run the stock class"
        if stock_name in EXPORTABLE
        else "serve it with transformers (natbias.hf)"
    )
    return f"vLLM {vllm.__version__} cannot serve a natural-bias {stock_name}: {WHY_NOT[why]}; {instead}"


def refusal_of(name: str):
    """Why vLLM cannot serve architecture ``name`` (``NaturalBias<X>``), else
    None; read from the registry's names alone, no class loaded."""
    from transformers.models.auto import modeling_auto

    stock = stock_name(name)
    if stock is None or stock in TEXT_GENERATION_MODELS:
        return None
    if dict.__contains__(ModelRegistry.models, stock):  # only its Transformers backend
        return None if stock in BACKEND_SERVED else refusal(stock, "backend")
    seq2seq = stock in modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values()
    return refusal(stock, "seq2seq" if seq2seq else "causal")


EXPORTABLE = {"PhiForCausalLM", "GPTJForCausalLM", "CodeGenForCausalLM"}


def natural_bias_class(stock_name: str) -> type:
    """``NaturalBias<stock_name>`` over vLLM's class of that architecture
    (served: :func:`refusal_of` has let it through), made once."""
    return natural_bias_subclass(load_model_class(stock_name), NaturalBiasCausalLM)


def register_architectures() -> None:
    """``NaturalBias<X>`` in vLLM's ``ModelRegistry`` for each text
    generation architecture ``X`` vLLM has a class of its own for (served),
    and for each generator transformers has (served through vLLM's Transformers
    backend where tested there, :data:`BACKEND_SERVED`; else refused in one
    line when vLLM looks it up, so that the backend never serves it without
    b), each a lazy ``module:class`` entry."""
    from transformers.models.auto import modeling_auto

    served = set(TEXT_GENERATION_MODELS) & set(ModelRegistry.get_supported_archs())
    mappings = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )
    names = {n for mapping in mappings for n in mapping.values() if isinstance(n, str)}
    for stock in sorted(served | names):
        if stock_name(stock) is None:
            name = PREFIX + stock
            ModelRegistry.models[name] = InProcess(__name__, name)
    refuse_in_registry(refusal_of)


def __getattr__(name: str):
    """``NaturalBias<X>``, made (or refused) when vLLM first loads it."""
    if stock_name(name) is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    why = refusal_of(name)
    if why is not None:
        raise NaturalBiasError(why)
    return natural_bias_class(stock_name(name))
