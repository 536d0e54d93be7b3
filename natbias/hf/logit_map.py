"""What a model does to its head's output before it returns logits, and the b
that starts it at the unigram all the same.

Most transformers generators return the head's output as it is (plus
``final_logits_bias``). Some map it elementwise first: Cohere multiplies it
by ``logit_scale``, Granite divides it by ``logits_scaling``, Gemma 2 and
others soft-cap it, ``c tanh(x / c)``. With such a map f the logits start at
f(g W phi + b) ≈ f(b), and softmax(f(b)) is the unigram only if

    f(b) = log p + k        (any constant k: softmax does not see it)

so b = f^-1(log p + k). A scale s gives b = log p / s. (T5's d^-0.5 on
the decoder output of a tied head scales phi, not b: its f is the identity;
its larger W phi at init is the gain's to damp.) A soft cap is a
bijection onto (-c, c) only: k centres log p, and its span must fit within
2c (with a margin, where tanh is not flat); else the model is refused.

The map is measured, not read from the configuration, whose names and
meanings differ by family (Granite divides by ``logits_scaling`` where
HyperCLOVA X multiplies): one forward of one token with the head's output
replaced by a known vector z (W phi = 0) gives f(z); f is a scale if it
fits one, a soft cap if the configuration names ``final_logit_softcapping``
and it fits that, and anything else is refused. After b is set, a second
such forward checks softmax(f(b)) = p.
"""

import math
from typing import Optional

import torch

from natbias.errors import NaturalBiasError

# The largest |log p + k| / c a soft cap may start at: tanh's slope there is 1 - 0.95^2 ≈ 0.1.
SOFTCAP_MARGIN = 0.95


def map_bias(bias: torch.Tensor, logit_map: Optional[dict]) -> torch.Tensor:
    """f(b): ``{"scale": s}``, ``{"softcap": c}`` (after the scale, where both), or b."""
    if not logit_map:
        return bias
    mapped = bias * logit_map.get("scale", 1.0)
    cap = logit_map.get("softcap")
    return mapped if cap is None else torch.tanh(mapped / cap) * cap


def initial_bias(log_prior: torch.Tensor, logit_map: Optional[dict], name: str) -> torch.Tensor:
    """b with softmax(f(b)) = exp(log_prior), computed in float64."""
    target = log_prior.double()
    if not logit_map:
        return log_prior.clone()
    cap = logit_map.get("softcap")
    if cap is not None:
        target = target - (target.max() + target.min()) / 2
        span = (target.max() - target.min()).item()
        if span / 2 > SOFTCAP_MARGIN * cap:
            raise NaturalBiasError(
                f"{name} soft-caps its logits at ±{cap:g}, and the log prior spans "
                f"{span:.1f} nats, more than the cap lets it start at (2 x {SOFTCAP_MARGIN} x "
                f"{cap:g}): raise final_logit_softcapping, or smooth the counts more"
            )
        target = cap * torch.atanh(target / cap)
    return (target / logit_map.get("scale", 1.0)).float()


def measure_logit_map(model, name: str) -> Optional[dict]:
    """f of ``model`` (a stock model, before it is given the natural bias):
    None for the identity, else the map's settings."""
    vocab_size = model.get_output_embeddings().weight.shape[0]
    z = torch.linspace(-16.0, 16.0, vocab_size, dtype=torch.float64)
    logits = logits_for_bias(model, z)
    tolerance = _tolerance(model, logits)
    config = model.config
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is None and hasattr(config, "get_text_config"):
        cap = getattr(config.get_text_config(), "final_logit_softcapping", None)
    if isinstance(cap, (int, float)) and math.isfinite(cap) and cap:
        if (logits - cap * torch.tanh(z / cap)).abs().max() <= tolerance:
            return {"softcap": float(cap)}
    centred = z - z.mean()
    scale = ((logits - logits.mean()) * centred).sum() / (centred * centred).sum()
    fitted = scale * centred + logits.mean()
    if scale.item() > 0 and (logits - fitted).abs().max() <= tolerance:
        scale = torch.tensor(scale.item(), dtype=torch.float32).item()  # 0.0625, not 0.0625000009
        return None if abs(scale - 1.0) <= 1e-6 else {"scale": scale}
    raise NaturalBiasError(
        f"{name} maps its head's output to logits in a way natbias.hf cannot "
        "invert (neither a scale nor the soft cap its configuration names), "
        "so it could not start at the unigram"
    )


def check_starts_at_prior(model, bias: torch.Tensor, log_prior: torch.Tensor, name: str) -> None:
    """softmax of the logits with W phi = 0 and b = ``bias`` (the model's
    own, which on the meta device has no values yet) is the prior, to rounding."""
    logits = logits_for_bias(model, bias.detach().double())
    error = (torch.log_softmax(logits, -1) - log_prior.double()).abs().max().item()
    if not error <= _tolerance(model, logits):
        raise NaturalBiasError(
            f"{name} with the natural bias would not start at the unigram (its "
            f"log-probabilities differ from log p by up to {error:.3g}): it is refused"
        )


def logits_for_bias(model, bias: torch.Tensor) -> torch.Tensor:
    """The logits (float64, one position) the model gives when its head
    outputs ``bias`` alone (W phi = 0), with ``final_logits_bias`` as the
    total bias where the model adds one after the head."""
    head = model.get_output_embeddings()
    extra = getattr(model, "final_logits_bias", None)

    def replace(module, args, output):
        value = bias if extra is None else bias - extra.detach().reshape(-1).double().cpu()
        # On the meta device only the head's output holds values: the map after it computes on them.
        device = "cpu" if output.device.type == "meta" else output.device
        return value.to(device, output.dtype).expand(output.shape).clone()

    return run_probe(model, head.register_forward_hook(replace))[0, -1].double().cpu()


def run_probe(model, *handles) -> torch.Tensor:
    """The logits of ``model`` on :func:`one_token_inputs`, in eval mode and
    without gradients; a model that fails on them is refused in one line.
    ``handles``: hooks on its modules, removed once it has run."""
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(**one_token_inputs(model)).logits
    except Exception as error:  # noqa: BLE001 -- any failure of the model's forward
        meta = model.get_output_embeddings().weight.device.type == "meta"
        where = " on the meta device" if meta else ""
        fix = ": build it on a real device to add the natural bias" if where else ""
        raise NaturalBiasError(
            f"{type(model).__name__} did not run on one token{where} ({type(error).__name__}: "
            f"{error}), which natbias.hf needs to check where its logits start{fix}"
        ) from error
    finally:
        model.train(training)
        for handle in handles:
            handle.remove()


def one_token_inputs(model) -> dict:
    """The inputs of a forward pass over one token (and one decoder token):
    the configuration's BOS (and decoder start) where it is inside the
    vocabulary. A configuration written as its family's defaults with only
    the vocabulary changed keeps their ids (GPT-2's 50256 in a vocabulary of
    8,000): the probe passes over those, to EOS, padding, else id 0."""
    config = model.config
    embeddings = model.get_input_embeddings().weight
    vocab_size = min(embeddings.shape[0], model.get_output_embeddings().weight.shape[0])
    token = _first_in(config, ("bos_token_id", "eos_token_id", "pad_token_id"), vocab_size, 0)
    ids = torch.tensor([[token]], device=embeddings.device)
    if getattr(config, "is_encoder_decoder", False):
        start = _first_in(config, ("decoder_start_token_id",), vocab_size, token)
        return {"input_ids": ids, "decoder_input_ids": torch.tensor([[start]], device=ids.device)}
    return {"input_ids": ids}


def _first_in(config, keys, vocab_size: int, default: int) -> int:
    """The first of the configuration's ``keys`` that is an id in the vocabulary."""
    for key in keys:
        token = getattr(config, key, None)
        if isinstance(token, int) and not isinstance(token, bool) and 0 <= token < vocab_size:
            return token
    return default


def _tolerance(model, logits: torch.Tensor) -> float:
    eps = torch.finfo(model.get_output_embeddings().weight.dtype).eps
    return 16 * eps * max(1.0, logits.abs().max().item())
