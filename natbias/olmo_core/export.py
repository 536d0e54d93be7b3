"""The way out of OLMo-core: a natural-bias model as a natbias.hf
(transformers) checkpoint, b and the gain as trained.

    natbias.olmo_core.to_hf(model, "out/hf")      # then natbias.hf.from_pretrained("out/hf")

OLMo-core's own conversion (``olmo_core.nn.hf.checkpoint.save_hf_model``)
writes everything but the head's b and gain, which its transformers classes
(``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``) do not have; natbias.hf then
gives that model the natural bias from the same counts, smoothing and gain
settings (:func:`natbias.hf.add_natural_bias`), and b and the gain
parameter take their trained values. The result is a natbias.hf model: its
Auto classes, ``natbias.hf.from_pretrained``, ``natbias.hf.to_stock`` (b in
the stock head's bias slot where one exists, the gain folded into W) and
the existing vLLM and CTranslate2 paths take it. Needs transformers (the
[hf] extra).
"""

import tempfile
from pathlib import Path

import torch

from natbias.errors import NaturalBiasError
from natbias.olmo_core import _compat
from natbias.olmo_core.natural_bias import NaturalBiasModel
from natbias.sharding import is_dtensor


def to_hf(model, output_dir, tokenizer=None):
    """Writes ``model`` (an OLMo-core model given the natural bias, whole on
    this process: gather a sharded one first) to ``output_dir`` as a
    natbias.hf checkpoint, float32, and returns the transformers model.
    ``tokenizer``: a transformers tokenizer whose special ids the
    configuration takes (OLMo-core's ``save_hf_model`` argument)."""
    if not isinstance(model, NaturalBiasModel):
        raise NaturalBiasError(
            "to_hf exports a model given the natural bias (natbias.olmo_core.add_natural_bias); "
            "OLMo-core's own save_hf_model converts a stock one"
        )
    head = model.natbias_head
    if any(is_dtensor(p) for p in model.parameters()):
        raise NaturalBiasError(
            "the model is sharded: gather its state whole (or load its checkpoint into an "
            "unsharded model on one process) before converting it"
        )
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    bias = state.pop(_compat.HEAD_BIAS_KEY)
    gain = state.pop(_compat.HEAD_GAIN_KEY, None)
    settings = head.natbias_settings
    with tempfile.TemporaryDirectory() as stock_dir:
        _compat.save_hf_model(f"{stock_dir}/stock", state, model, tokenizer)
        hf_model = _load_stock(f"{stock_dir}/stock")
    import natbias.hf

    natbias.hf.add_natural_bias(
        hf_model,
        counts=head.natbias_counts,
        smoothing=settings["smoothing"],
        gain=settings["gain_speed"] is not None,
        gain_init=settings["gain_init"],
        gain_speed=settings["gain_speed"] or 1.0,
    )
    hf_head = hf_model.get_output_embeddings()
    with torch.no_grad():
        hf_head.bias.copy_(bias)
        if gain is not None:
            hf_head.gain_param.copy_(gain)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(output_dir)
    return hf_model


def _load_stock(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
