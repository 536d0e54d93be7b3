"""Every private vLLM name natbias.vllm uses, in one place, with the version it
is tested with: vLLM 0.32.0 (its CPU build, ``make vllm-env``). An upgrade
that moves one of them breaks here, in one line naming it, not in a model
served without its bias:

* ``LogitsProcessor._apply_head(lm_head, hidden_states, embedding_bias)``: the
  head's product, which the natural-bias logits layer changes (:class:`HeadProduct`),
  and its ``__init__``'s arguments, kept as attributes (:func:`rebuilt`);
* the model registry's ``_TEXT_GENERATION_MODELS`` (the architectures vLLM has
  a class of its own for), ``_LazyRegisteredModel`` and ``_ModelInfo`` (a lazy
  entry inspected in this process) and ``_try_load_model_cls``;
* where the registry looks an architecture up: ``_try_inspect_model_cls``
  reads ``ModelRegistry.models[name]`` before the ``try`` that turns an
  inspection's error into "failed to be inspected", so a refusal raised by
  that look-up reaches the user as it is (:class:`RefusingModels`).
"""

import vllm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.models import registry

from natbias.errors import NaturalBiasError, require_private

TESTED = "0.32.0"
PRIVATE = (
    (registry, ("_TEXT_GENERATION_MODELS", "_LazyRegisteredModel", "_ModelInfo")),
    (LogitsProcessor, ("_apply_head",)),
    (registry.ModelRegistry, ("_try_load_model_cls", "_try_inspect_model_cls")),
)
require_private("natbias.vllm", f"vLLM {vllm.__version__}", f"vLLM {TESTED}",
                f"pip install vllm=={TESTED}", PRIVATE)  # fmt: skip

TEXT_GENERATION_MODELS = registry._TEXT_GENERATION_MODELS
ModelRegistry = registry.ModelRegistry


def load_model_class(name: str):
    """vLLM's class of architecture ``name``, None where it has none."""
    return ModelRegistry._try_load_model_cls(name)


class HeadProduct:
    """Mixin placed before a ``LogitsProcessor`` class: its product with the
    head is ``self.head_product(product, hidden_states)``, ``product`` the
    stock one (vLLM's LoRA wraps the layer and calls the same product)."""

    def head_product(self, product, hidden_states):
        return product(hidden_states)

    def _apply_head(self, lm_head, hidden_states, embedding_bias):
        stock = super()._apply_head
        return self.head_product(lambda h: stock(lm_head, h, embedding_bias), hidden_states)


def rebuilt(layer: LogitsProcessor, layer_class: type) -> LogitsProcessor:
    """A ``layer_class`` built with the arguments vLLM built ``layer`` with
    (read back from its attributes, as vLLM 0.32's ``__init__`` keeps them)."""
    if type(layer) is not LogitsProcessor:
        raise NaturalBiasError(
            f"natbias.vllm knows vLLM's LogitsProcessor, not {type(layer).__name__}"
        )
    return layer_class(layer.vocab_size, layer.org_vocab_size, layer.scale,
                       layer.logits_as_input, layer.soft_cap)  # fmt: skip


class InProcess(registry._LazyRegisteredModel):
    """vLLM's lazy ``module:class`` entry (``register_model`` makes one),
    inspected in this process: vLLM inspects an entry in a new process
    (importing vLLM, seconds to a minute) unless it has cached that module's
    answer, which it has not for classes made at run time. Importing vLLM's
    own model modules here is what its engine does anyway."""

    def inspect_model_cls(self):
        return registry._ModelInfo.from_model_cls(self.load_model_cls())


class RefusingModels(dict):
    """``ModelRegistry.models`` where an architecture ``refusal(name)`` names
    (a string: why it is refused) is known, so that vLLM does not fall back
    to its Transformers backend, which would serve the model without b, but
    looking it up raises the refusal."""

    def __init__(self, models: dict, refusal):
        super().__init__(models)
        self.refusal = refusal

    def __getitem__(self, name):
        why = self.refusal(name) if isinstance(name, str) else None
        if why is not None:
            raise NaturalBiasError(why)
        return dict.__getitem__(self, name)


def refuse_in_registry(refusal) -> None:
    """Architectures ``refusal`` names refused in one line when vLLM looks them up."""
    if not isinstance(ModelRegistry.models, RefusingModels):
        ModelRegistry.models = RefusingModels(ModelRegistry.models, refusal)
