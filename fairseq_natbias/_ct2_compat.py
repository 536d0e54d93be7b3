"""The private CTranslate2 name fairseq_natbias.ct2 uses (tested with
CTranslate2 4.8.5, the [ctranslate2] extra): ``FairseqConverter._load``, the
method its own converters implement (its way in), handed to ``load_spec``."""

import ctranslate2
from ctranslate2.converters import FairseqConverter

from natbias.errors import NaturalBiasError

if not hasattr(FairseqConverter, "_load"):
    raise NaturalBiasError(
        f"fairseq_natbias.ct2 is tested with CTranslate2 4.8.5, whose FairseqConverter._load "
        f"CTranslate2 {ctranslate2.__version__} lacks: pip install 'ctranslate2==4.8.5'"
    )


class Converter(FairseqConverter):
    """``FairseqConverter`` whose specification ``load_spec(stock_load)`` makes."""

    def _load(self):
        return self.load_spec(super()._load)
