"""Every private transformers name natbias.hf uses, in one place, with the
version it is tested with: transformers 5.25 (the [hf] extra allows 5.x). An
upgrade that moves one of them breaks here, in one line naming it:

* ``CONFIG_MAPPING._extra_content``: the ``model_type`` entries registered
  beside transformers' own, which :mod:`natbias.hf.registry` makes a dict that
  registers ``natbias-<type>`` on its first look-up (transformers has no hook
  for a type made when first asked for);
* an Auto class's ``_model_mapping`` (configuration class -> model class) and
  ``auto_factory._get_model_class`` (the class it picks for a configuration);
* a model's ``_init_weights`` (the initialisation of each module, which
  :class:`InitWeights` hands to ``init_natural_bias``) and ``_tp_plan`` (a
  tensor-parallel style by parameter name).
"""

import transformers
from transformers.models.auto import auto_factory
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from natbias.errors import NaturalBiasError

TESTED = "5.25"
for owner, name in (
    (CONFIG_MAPPING, "_extra_content"),
    (auto_factory, "_get_model_class"),
    (transformers.AutoModelForCausalLM, "_model_mapping"),
    (transformers.PreTrainedModel, "_init_weights"),
):
    if not hasattr(owner, name):
        raise NaturalBiasError(
            f"natbias.hf is tested with transformers {TESTED}, whose {name} transformers "
            f"{transformers.__version__} lacks: pip install 'transformers=={TESTED}.*'"
        )


def model_classes(auto_class, config_class):
    """The model class (or classes) ``auto_class`` maps ``config_class`` to, else None."""
    mapping = auto_class._model_mapping
    return mapping[config_class] if config_class in mapping else None


def model_class(auto_class, config):
    """The one class ``auto_class`` builds for ``config``, else None."""
    if type(config) not in auto_class._model_mapping:
        return None
    return auto_factory._get_model_class(config, auto_class._model_mapping)


def extend_config_types(dict_class) -> None:
    """``CONFIG_MAPPING``'s registered types made a ``dict_class`` (a second call does nothing)."""
    registered = CONFIG_MAPPING._extra_content
    if not isinstance(registered, dict_class):
        CONFIG_MAPPING._extra_content = dict_class(registered)


class InitWeights:
    """Mixin before a transformers model class: its ``_init_weights``, then
    ``init_natural_bias`` of the same module."""

    def _init_weights(self, module):
        super()._init_weights(module)
        self.init_natural_bias(module)


def replicate_in_tp_plan(model, module_name: str, parameter: str) -> None:
    """``module_name.parameter`` kept whole on every process where the model's
    tensor-parallel plan splits ``module_name``."""
    plan = getattr(model, "_tp_plan", None)
    if plan and module_name in plan:
        plan[f"{module_name}.{parameter}"] = "replicate"
