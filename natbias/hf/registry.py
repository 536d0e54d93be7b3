"""The natural-bias classes in transformers' Auto classes, made when first
needed rather than for every architecture at import.

``AutoConfig`` resolves a saved ``model_type`` through ``CONFIG_MAPPING``,
whose registered entries live in a dict. :func:`install` (run by ``import
natbias.hf``) gives it a dict that, asked for ``natbias-<type>`` the first
time, makes the natural-bias configuration of ``<type>`` and the
natural-bias classes of the models ``AutoModelForCausalLM`` and
``AutoModelForSeq2SeqLM`` map it to (and, for ``AutoModel``, the stock
backbone), and registers them as
``AutoConfig.register`` and ``AutoModel*.register`` do. So a model saved
with the natural bias loads through the Auto classes in a fresh process,
and importing natbias.hf imports no architecture it does not use.
transformers' private names are :mod:`natbias.hf._compat`'s.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from natbias.hf._compat import extend_config_types, model_classes
from natbias.hf.models import TYPE_PREFIX, natural_bias_class

GENERATOR_AUTO_CLASSES = (AutoModelForCausalLM, AutoModelForSeq2SeqLM)


def register(natbias_class: type) -> None:
    """Registers a natural-bias class's configuration with ``AutoConfig`` and
    the natural-bias classes of the generators the Auto classes map its
    stock configuration to (``natbias_class`` among them where it is one)."""
    config_class = natbias_class.config_class
    stock_config_class = natbias_class.natbias_stock_class.config_class
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    backbone = model_classes(AutoModel, stock_config_class)
    if isinstance(backbone, type):
        # The stock backbone under the natural-bias configuration (the bias
        # is in the head, which a backbone has not): what AutoModel builds of
        # a saved natural-bias model, as vLLM's Transformers backend does.
        backbone = type(backbone.__name__, (backbone,), {"config_class": config_class})
        AutoModel.register(config_class, backbone, exist_ok=True)
    for auto_class in GENERATOR_AUTO_CLASSES:
        stock = model_classes(auto_class, stock_config_class)
        if stock is not None:
            if isinstance(stock, (list, tuple)):
                made = tuple(natural_bias_class(model_class) for model_class in stock)
            else:
                made = natural_bias_class(stock)
            auto_class.register(config_class, made, exist_ok=True)


def register_model_type(model_type: str) -> bool:
    """Registers ``natbias-<type>`` for a stock ``<type>`` transformers knows
    and that has a generator; False for any other name."""
    if not model_type.startswith(TYPE_PREFIX):
        return False
    stock_type = model_type[len(TYPE_PREFIX) :]
    if stock_type.startswith(TYPE_PREFIX) or stock_type not in CONFIG_MAPPING:
        return False
    stock_config_class = CONFIG_MAPPING[stock_type]
    for auto_class in GENERATOR_AUTO_CLASSES:
        stock = model_classes(auto_class, stock_config_class)
        if stock is not None:
            stock = stock[0] if isinstance(stock, (list, tuple)) else stock
            register(natural_bias_class(stock))
            return True
    return False


class _RegisteredTypes(dict):
    """``CONFIG_MAPPING``'s registered types, which makes ``natbias-<type>``
    on its first look-up (``in`` and ``[]``, what transformers asks)."""

    def __contains__(self, model_type) -> bool:
        if dict.__contains__(self, model_type):
            return True
        return isinstance(model_type, str) and register_model_type(model_type)

    def __getitem__(self, model_type):
        if not dict.__contains__(self, model_type) and isinstance(model_type, str):
            register_model_type(model_type)
        return dict.__getitem__(self, model_type)


def install() -> None:
    """Makes ``natbias-<type>`` known to ``AutoConfig`` (a second call does nothing)."""
    extend_config_types(_RegisteredTypes)
