"""The private CTranslate2 names natbias.hf.ct2 uses, tested with CTranslate2
4.8.5 (the [ctranslate2] extra); another version that moved one is refused
here in one line:

* ``converters.transformers._MODEL_LOADERS``: the loaders by configuration
  class name, which ``register_loader`` fills and nothing public reads;
* a converter's ``_load``, the method CTranslate2's own converters implement
  (its way in): :class:`Converter` hands it to ``load_spec``.
"""

import ctranslate2
from ctranslate2.converters import TransformersConverter
from ctranslate2.converters import transformers as ct2_transformers

from natbias.errors import NaturalBiasError

if not isinstance(getattr(ct2_transformers, "_MODEL_LOADERS", None), dict) or not hasattr(
    TransformersConverter, "_load"
):
    raise NaturalBiasError(
        f"natbias.hf.ct2 is tested with CTranslate2 4.8.5, whose _MODEL_LOADERS CTranslate2 "
        f"{ctranslate2.__version__} lacks: pip install 'ctranslate2==4.8.5'"
    )
LOADERS = ct2_transformers._MODEL_LOADERS
register_loader = ct2_transformers.register_loader


class Converter(TransformersConverter):
    """``TransformersConverter`` whose specification ``load_spec(stock_load)`` makes."""

    def _load(self):
        return self.load_spec(super()._load)
