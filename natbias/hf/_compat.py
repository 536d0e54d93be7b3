"""Every private transformers name natbias.hf uses, in one place, with the
version it is tested with: transformers 5.25 (the [hf] extra allows 5.x). An
upgrade that moves one of them breaks here, in one line naming it:

* ``CONFIG_MAPPING._extra_content``: the ``model_type`` entries registered
  beside transformers' own, which :mod:`natbias.hf.registry` makes a dict that
  registers ``natbias-<type>`` on its first look-up (transformers has no hook
  for a type made when first asked for);
* an Auto class's ``_model_mapping`` (configuration class -> model class) and
  ``auto_factory._get_model_class`` (the class it picks for a configuration);
* a model's ``_init_weights`` (each module's initialisation, also handed to
  ``init_natural_bias``) and ``_tp_plan`` (a tensor-parallel style a name);
* CTranslate2's (tested: 4.8.5) ``_MODEL_LOADERS`` (its loaders by
  configuration class name, which nothing public reads) and a converter's
  ``_load`` (its way in, made ``load_spec(stock_load)``).
"""

import transformers
from transformers.models.auto import auto_factory
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from natbias.errors import require_private

TESTED = "5.25"
require_private("natbias.hf", f"transformers {transformers.__version__}", f"transformers {TESTED}",
                f"pip install 'transformers=={TESTED}.*'", (
                    (CONFIG_MAPPING, ("_extra_content",)),
                    (auto_factory, ("_get_model_class",)),
                    (transformers.AutoModelForCausalLM, ("_model_mapping",)),
                    (transformers.PreTrainedModel, ("_init_weights",)),
                ))  # fmt: skip


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
    """Mixin before a model class: its ``_init_weights``, then ``init_natural_bias``."""

    def _init_weights(self, module):
        super()._init_weights(module)
        self.init_natural_bias(module)


class LoadSpec:
    """Mixin before a CTranslate2 converter: its ``_load`` made ``load_spec(stock_load)``."""

    def _load(self):
        return self.load_spec(super()._load)


def ct2_loaders() -> dict:
    from ctranslate2 import __version__
    from ctranslate2.converters import transformers

    require_private("natbias.hf.ct2", f"CTranslate2 {__version__}", "CTranslate2 4.8.5",
                    "pip install 'ctranslate2==4.8.5'", ((transformers, ("_MODEL_LOADERS",)),))  # fmt: skip
    return transformers._MODEL_LOADERS


def replicate_in_tp_plan(model, module_name: str, parameter: str) -> None:
    """``module_name.parameter`` whole on every process where the plan splits the module."""
    plan = getattr(model, "_tp_plan", None)
    if plan and module_name in plan:
        plan[f"{module_name}.{parameter}"] = "replicate"
