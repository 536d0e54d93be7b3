"""A natural-bias transformers model as a CTranslate2 model, by CTranslate2's
own converter and its loader of the stock family:
``natbias.hf.to_ctranslate2(model_or_directory, output_dir)``.

No stock transformers class of Llama, Qwen, Gemma, GPT-2, T5, ... has a slot
for b, but CTranslate2's decoder output projection takes a bias. So each
family is converted by CTranslate2's loader of its stock class (the
natural-bias class differs from it in the head alone), and then the
projection is made ``W (g phi) + b``'s, capped where the model caps its
logits. What cannot be served exactly is refused (docs/deployment.md), from
the configuration before any weight is read.
"""

import copy
import os
from typing import Optional

import numpy as np
import torch
from transformers import AutoConfig

from natbias.errors import MissingExtraError, NaturalBiasError
from natbias.head import fold_gain
from natbias.hf._compat import LoadSpec, ct2_loaders
from natbias.hf.models import NaturalBiasModel, natural_bias_settings
from natbias.hf.natural_bias import from_pretrained
from natbias.subclasses import natural_bias_subclass

try:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters import transformers as ct2_transformers
except ImportError as error:
    raise MissingExtraError(
        "converting to CTranslate2 needs ctranslate2: pip install 'fairseq-natbias[ctranslate2]'"
    ) from error
LOADERS = ct2_loaders()


def to_ctranslate2(
    model, output_dir: str, tokenizer=None, quantization: Optional[str] = None, **options
) -> str:
    """Write the CTranslate2 model of ``model`` (a natural-bias model, or the
    directory it was saved to with its tokenizer) to ``output_dir`` and
    return it. ``quantization``: CTranslate2's (int8, float16, ...);
    ``options``: ``force``, ``vmap`` (those of ``Converter.convert``) and
    ``TransformersConverter``'s (``copy_files``, ``low_cpu_mem_usage``, ...).
    A model object is copied first (CTranslate2's loaders take the model
    apart as they read it); give a directory for one too large to hold twice."""
    convert = {key: options.pop(key) for key in ("force", "vmap") if key in options}
    converter = NaturalBiasTransformersConverter(model, tokenizer, **options)
    return converter.convert(output_dir, quantization=quantization, **convert)


class NaturalBiasTransformersConverter(LoadSpec, TransformersConverter):
    """``TransformersConverter`` for a natural-bias model: a saved directory
    (read as ``ct2-transformers-converter --model`` reads one) or an object."""

    def __init__(self, model, tokenizer=None, **options):
        directory = isinstance(model, (str, os.PathLike))
        self.directory = os.fspath(model) if directory else None
        super().__init__(self.directory or "", **options)
        self._model = None if directory else model
        self._tokenizer = tokenizer

    def load_spec(self, stock_load):
        if self._model is None:
            if not os.path.isfile(os.path.join(self.directory, "config.json")):
                raise NaturalBiasError(
                    f"{self.directory} holds no config.json: give the directory "
                    "a natbias.hf model was saved to (save_pretrained)"
                )
            register_loader(AutoConfig.from_pretrained(self.directory))
            return stock_load()
        if not isinstance(self._model, NaturalBiasModel):
            raise NaturalBiasError(
                f"{type(self._model).__name__} has no natural bias: convert it with "
                "CTranslate2's ct2-transformers-converter"
            )
        if self._tokenizer is None:
            raise NaturalBiasError(
                "give the model's tokenizer (tokenizer=): CTranslate2 keeps the "
                "vocabulary and the special tokens with the model"
            )
        loader = register_loader(self._model.config)
        with torch.no_grad():  # as TransformersConverter reads a directory: some loaders edit views
            return loader(copy.deepcopy(self._model).eval(), self._tokenizer)

    def load_model(self, model_class, model_name_or_path, **kwargs):
        return from_pretrained(model_name_or_path, **kwargs)  # the natural-bias class

    def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
        if self._tokenizer is not None:
            return self._tokenizer
        return super().load_tokenizer(tokenizer_class, model_name_or_path, **kwargs)


def register_loader(config):
    """CTranslate2's loader for a natural-bias configuration: registered once
    under its class name (how CTranslate2 finds a loader), a subclass of the
    stock family's loader that places b and the gain after it has run. A
    configuration that cannot be served exactly is refused first."""
    check_servable(config, natural_bias_settings(config))
    name = type(config).__name__
    if name in LOADERS:
        return LOADERS[name]
    stock_name = type(config).__mro__[1].__name__
    stock = LOADERS.get(stock_name)
    if stock is None:
        raise NaturalBiasError(
            f"CTranslate2 {ctranslate2.__version__} has no loader for {stock_name} "
            f"(ct2-transformers-converter cannot convert the stock model either), "
            "so it cannot serve this model"
        )
    ct2_transformers.register_loader(name)(natural_bias_subclass(type(stock), NaturalBiasLoader))
    return LOADERS[name]


class NaturalBiasLoader:
    """Mixin before a stock CTranslate2 loader: reads b, g and the logit map
    before the stock loader takes the model apart, then puts them in the
    specification it made."""

    def __call__(self, model, tokenizer):
        gain = model.output_gain()  # g as a float, 1 without a gain
        gain = 1.0 if gain is None else float(gain.detach().reshape(()))
        cap = (model.natbias_logit_map or {}).get("softcap")  # None without one
        bias = model.output_bias().detach().clone()
        try:
            spec = super().__call__(model, tokenizer)
        except (AttributeError, KeyError, ValueError, NotImplementedError) as error:
            stock = type(self).__mro__[2].__name__
            raise NaturalBiasError(
                f"CTranslate2 {ctranslate2.__version__}'s {stock} cannot read "
                f"{type(model).__name__} under this transformers ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}), nor the stock "
                "model: it cannot serve this family here"
            ) from error
        place_natural_bias(spec, bias, gain, cap)
        return spec


def check_servable(config, settings: dict) -> None:
    """Refuses what CTranslate2 would serve inexactly: a logit map other than
    a soft cap, and Gemma 2's settings that its Gemma2 loader leaves out (so
    that it serves the stock model inexactly too)."""
    logit_map = {k: v for k, v in (settings.get("logit_map") or {}).items() if k != "softcap"}
    if logit_map:
        raise NaturalBiasError(
            f"this model maps its logits by {logit_map}, which no CTranslate2 "
            "specification applies: it cannot be served exactly"
        )
    if type(config).__mro__[1].__name__ != "Gemma2Config":
        return
    left_out = []
    if getattr(config, "attn_logit_softcapping", None):
        left_out.append(f"attn_logit_softcapping {config.attn_logit_softcapping:g}")
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar is not None and scalar != config.head_dim:
        left_out.append(f"query_pre_attn_scalar {scalar:g} (not head_dim {config.head_dim})")
    if left_out:
        raise NaturalBiasError(
            f"this Gemma 2 has {' and '.join(left_out)}, which CTranslate2 "
            f"{ctranslate2.__version__}'s Gemma2 loader leaves out: it cannot be served exactly"
        )


def place_natural_bias(spec, bias: torch.Tensor, gain: float, cap: Optional[float]) -> None:
    """The decoder's output projection made ``g W phi + b`` (then capped)."""
    decoder = getattr(spec, "decoder", None)
    projection = getattr(decoder, "projection", None)
    if projection is None or (cap is not None and not hasattr(decoder, "final_logit_softcapping")):
        raise NaturalBiasError(
            f"CTranslate2's {type(spec).__name__} has no decoder output projection to "
            "hold b (or no soft cap for the logits): it cannot serve this model exactly"
        )
    weight = torch.as_tensor(projection.weight)  # numpy's shared, not copied
    projection.weight = fold_gain(weight, gain)  # a new tensor: shared embeddings keep W
    # A loader may drop trailing rows it does not serve (Marian's <pad>).
    projection.bias = bias[: weight.shape[0]].to(weight.dtype)
    if cap is not None:
        set_cap = decoder.final_logit_softcapping
        if not isinstance(set_cap, str) and float(set_cap) != cap:
            raise NaturalBiasError(
                f"CTranslate2's loader caps the logits at {float(set_cap):g}, the model at {cap:g}"
            )
        decoder.final_logit_softcapping = np.float32(cap)
