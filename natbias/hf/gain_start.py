"""The gain's start where the caller gives none: chosen from the measured
scale of W phi, so that every family starts at the unigram.

A fresh model's logits are f(g W phi + b) with f(b) = log p + k
(:mod:`natbias.hf.logit_map`). While g W phi is small the model predicts p
tilted by it, whose KL from p is, to second order,

    KL ≈ g² Var_p(W phi) / 2

So how near ``DEFAULT_GAIN_INIT`` (0.05) starts a model depends on the scale
of its W phi, which families set differently: GPT-2, Llama and most others
draw W from N(0, 0.02²), T5 from N(0, 1), so its W phi starts about 20 times
larger and 0.05 leaves it 2e-3 nats from the unigram. The start is therefore
``DEFAULT_GAIN_INIT``, lowered where the measured W phi would take the model
further than ``START_KL`` from the unigram:

    g0 = min(DEFAULT_GAIN_INIT, sqrt(2 START_KL) / s)

with s the standard deviation of W phi over the vocabulary on the one-token
probe (times the model's logit scale, if it has one). ``START_KL`` is 10
times below the 1e-3 nats the tests hold every family to: the probe is one
position, and Var_p at another position can be a few times s².

W phi is computed in float64 a block of vocabulary rows at a time, so that
the call never holds a copy of W (a float64 one of a 128k x 8,192 head
would be 8 GiB): add_natural_bias stays in place in memory.
"""

import math
from typing import Optional

import torch

from natbias.head import DEFAULT_GAIN_INIT
from natbias.hf.logit_map import run_probe

START_KL = 1e-4  # nats
# Entries of W copied to float64 at a time (2 MiB): a block of its rows.
BLOCK_ELEMENTS = 1 << 18


def initial_gain(scale: Optional[float]) -> float:
    """g0 for a W phi of standard deviation ``scale`` (None: not measured)."""
    if scale is None or not scale > 0:
        return DEFAULT_GAIN_INIT
    # Three significant digits: the value is written to the configuration.
    return min(DEFAULT_GAIN_INIT, float(f"{math.sqrt(2 * START_KL) / scale:.3g}"))


def contextual_scale(model, logit_map: Optional[dict] = None) -> Optional[float]:
    """The standard deviation over the vocabulary of the contextual logits
    W phi (the head's bias left out) of a stock ``model`` on the one-token
    probe, times ``logit_map``'s scale; None where nothing can be measured."""
    head = model.get_output_embeddings()
    if head.weight.is_meta:
        return None
    features = []
    run_probe(model, head.register_forward_pre_hook(lambda module, args: features.append(args[:1])))
    if not features or not features[-1]:  # the head never ran, or took phi by keyword
        return None
    phi = features[-1][0]
    phi = phi.reshape(-1, phi.shape[-1])[-1]  # the last position: the one a model predicts from
    contextual = contextual_logits(head.weight.detach(), phi)
    scale = contextual.std().item() * (logit_map or {}).get("scale", 1.0)
    return scale if math.isfinite(scale) else None


def contextual_logits(weight: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """W phi in float64, ``BLOCK_ELEMENTS`` entries of W at a time: the
    same numbers as ``F.linear(phi.double(), W.double())`` without a copy of W."""
    phi = phi.to(weight.device, torch.float64)
    rows = max(1, BLOCK_ELEMENTS // weight.shape[1])
    out = torch.empty(weight.shape[0], dtype=torch.float64, device=weight.device)
    for start in range(0, weight.shape[0], rows):
        out[start : start + rows] = torch.mv(weight[start : start + rows].double(), phi)
    return out
