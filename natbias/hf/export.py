"""A natural-bias model as its stock transformers class, with the same logits,
so that any engine that runs the stock class serves it (CTranslate2, vLLM,
text-generation-inference): ``natbias.hf.to_stock(model)``.

The logits ``W (g phi) + b`` fit a stock class that has a slot for b
(:data:`EXPORTABLE`). The gain g is folded where it costs least: into W
where the head is not tied to the input embeddings; else into the affine
normalisation whose output the head reads (g phi exactly), which keeps the
head tied; else the head is untied, with a warning.
"""

import functools
import logging
from typing import Optional

import torch
from torch import nn

from natbias.errors import NaturalBiasError
from natbias.head import fold_gain
from natbias.hf.logit_map import run_probe
from natbias.hf.models import FINAL_LOGITS_BIAS, SETTINGS, NaturalBiasModel, set_class

logger = logging.getLogger(__name__)

EXPORTABLE = (
    "those whose stock class has an output bias: Marian, BART, mBART, Pegasus, "
    "Blenderbot (final_logits_bias), Phi, GPT-J, CodeGen (the head's bias)"
)


def to_stock(model) -> nn.Module:
    """``model``, a natural-bias model, turned into its stock class in place
    (its parameters kept) and returned: b in the stock class's bias slot,
    the gain folded, the prior and the settings dropped."""
    if not isinstance(model, NaturalBiasModel):
        raise NaturalBiasError(f"{type(model).__name__} has no natural bias to export")
    stock_class = model.natbias_stock_class
    if model.natbias_slot is None:
        raise NaturalBiasError(
            f"{stock_class.__name__} has no output bias to hold b, so its stock "
            f"class cannot give the same logits; the families that can be exported are {EXPORTABLE}"
        )
    head = model.get_output_embeddings()
    slot = model.natbias_slot
    with torch.no_grad():
        bias = model.output_bias().detach().clone()
        gain = model.output_gain()
        if gain is not None and gain.item() != 1.0:
            _fold_gain(model, head, gain.item())
        dtype = head.weight.dtype
        linear = nn.Linear(head.in_features, head.out_features, bias=slot == "head", device="meta")
        linear.weight = head.weight
        if slot == "head":
            linear.bias = nn.Parameter(bias.to(dtype))
    # The natural bias dropped: its parameter, prior, attributes and settings.
    model._parameters.pop(FINAL_LOGITS_BIAS, None)
    model._buffers.pop("natbias_log_prior", None)
    for name in ("natbias_slot", "natbias_logit_map"):
        model.__dict__.pop(name, None)
    set_class(model, stock_class, stock_class.config_class)
    model.config.__dict__.pop(SETTINGS, None)
    model.config.architectures = [stock_class.__name__]
    model.set_output_embeddings(linear)
    if slot == FINAL_LOGITS_BIAS:
        model.register_buffer(FINAL_LOGITS_BIAS, bias.reshape(1, -1).to(dtype))
    return model


def _fold_gain(model, head, gain: float) -> None:
    """W phi g as W' phi or W phi', the head tied where it was."""
    named = model.named_parameters(remove_duplicate=False)
    if sum(1 for _, other in named if other is head.weight) == 1:
        fold_gain(head.weight, gain, in_place=True)
        return
    norm = _fold_into_norm(model, head, gain)
    if norm is not None:
        logger.info("the gain %.6g is folded into %s, so that the head stays tied", gain, norm)
        return
    tied = getattr(model, "all_tied_weights_keys", {}) or {}
    if len(tied) > 1:
        raise NaturalBiasError(
            f"{type(model).__name__}'s gain can be folded neither into a normalisation "
            "before the head nor into the head alone (its weight is tied to "
            f"{len(tied)} others): it is not exported"
        )
    logger.warning(
        "the head of %s is untied from the input embeddings to fold the gain %.6g into it "
        "(no affine normalisation precedes it): the export is %d parameters larger",
        type(model).__name__,
        gain,
        head.weight.numel(),
    )
    head.weight = nn.Parameter(fold_gain(head.weight.detach(), gain))
    model.config.tie_word_embeddings = False
    model.all_tied_weights_keys = {}


def _fold_into_norm(model, head, gain: float) -> Optional[str]:
    """The name of the affine normalisation whose output the head reads,
    its weight (and bias) scaled by g so that the head reads g phi; None if
    no module checks out."""
    before, outputs = _head_input_and_norm_outputs(model, head)
    for name, module in model.named_modules():
        output = outputs.get(name)
        if output is None or output.data_ptr() != before.data_ptr():
            continue
        before = before.clone()
        parameters = [p for p in (module.weight, getattr(module, "bias", None)) if p is not None]
        saved = [p.detach().clone() for p in parameters]
        for parameter in parameters:  # g (a phi + c) = (g a) phi + g c
            fold_gain(parameter, gain, in_place=True)
        after, _ = _head_input_and_norm_outputs(model, head)
        if after.shape == before.shape and torch.allclose(after, before * gain, 1e-5, 1e-6):
            return name
        for parameter, value in zip(parameters, saved):
            parameter.copy_(value)
    return None


def _head_input_and_norm_outputs(model, head):
    """The head's input on one token, and the outputs of the modules that
    could be a normalisation before it (a 1-d weight of the head's width)."""
    captured, outputs, handles = {}, {}, []
    width = head.in_features
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter) and weight.shape == (width,) and module is not head:
            handles.append(module.register_forward_hook(functools.partial(_keep, outputs, name)))
    handles.append(head.register_forward_pre_hook(lambda m, args: captured.update(x=args[0])))
    run_probe(model, *handles)
    return captured["x"].detach(), outputs


def _keep(outputs: dict, name: str, module, args, output) -> None:
    if isinstance(output, torch.Tensor):
        outputs[name] = output
