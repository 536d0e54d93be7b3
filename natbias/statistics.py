"""How far the output bias and the model are from the target unigram: the
statistics of the paper's App. A.6 (Figs. 13, 14) and Fig. 1, in bits, each
defined in docs/options.md#the-training-log.
:class:`Statistics` computes them; :mod:`natbias.metrics` says which each
engine logs and how.
"""

import math
from typing import Optional

import torch

from natbias import head
from natbias.sharding import full

LN2 = math.log(2.0)  # nats per bit: every figure in bits divides by it
# float32 entries per temporary of the per-token divergences (32 MiB), so that
# 8k tokens x a 32k vocabulary never need two such tensors whole.
CHUNK_ELEMENTS = 1 << 23


class Statistics:
    """Every statistic of one log line: :meth:`add` sums each batch's
    per-token divergences (on its device, without host synchronisation);
    ``values`` holds the output layer's (:func:`bias_statistics`)."""

    def __init__(self, chunk_elements: int = CHUNK_ELEMENTS, dtype=torch.float32):
        self.chunk_elements = chunk_elements  # float32 entries per temporary
        self.dtype = dtype  # of the running sums; float64 where many batches are read once
        self.sums, self.values = {}, {}  # nats over target tokens ("tokens": how many)

    def add(self, log_probs, mask, log_prior=None, rows=None, targets=None) -> None:
        """Adds the sums over the positions where ``mask`` is true of
        kl_unigram and kl_uniform (``rows``: each position's row of a
        per-language prior) and, given ``targets``, of their cross-entropy
        under the model (``nll``) and the prior (``unigram_ce``), which
        natbias-step0 prints. No prior: ``nll`` alone."""
        sums, scores = {"tokens": mask.sum()}, {"nll": log_probs}
        if log_prior is not None:
            kl = divergence_sums(log_probs, mask, log_prior, self.chunk_elements, rows)
            sums.update(kl_unigram=kl[0], kl_uniform=kl[1])
            scores["unigram_ce"] = head.bias_rows(log_prior, rows).expand_as(log_probs)
        for key, each in scores.items() if targets is not None else ():
            sums[key] = -each.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[mask].sum()
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.to(self.dtype)

    def bits(self) -> dict[str, float]:
        """``values``, then each per-token sum / tokens / ln 2 (no tokens: 0)."""
        sums = dict(self.sums)
        tokens = max(float(sums.pop("tokens", 0.0)), 1.0)
        return {**self.values, **{key: float(s) / tokens / LN2 for key, s in sums.items()}}


def bias_statistics(
    bias: Optional[torch.Tensor],
    log_prior: torch.Tensor,
    weight: torch.Tensor,
    gain: Optional[torch.Tensor] = None,
) -> dict[str, float]:
    """``bias_kl``, ``bias_norm`` (with a bias), ``weight_norm`` and ``gain``
    (with a gain) of an output layer, as floats. Sharded tensors (DTensors)
    are reduced or gathered: call it on every process then."""
    weight_norm = full(weight.detach().float().norm())
    if gain is not None:
        gain = full(gain.detach()).float().reshape(())
        weight_norm = weight_norm * gain.abs()
    stats = {"weight_norm": weight_norm.item()}
    if gain is not None:
        stats["gain"] = gain.item()
    if bias is not None:  # one row, or one per target language (their mean)
        b = head.all_rows(full(bias.detach()).float())
        log_b = b.log_softmax(-1)
        log_u = head.all_rows(log_prior.to(b.device, torch.float32))
        kl = (log_b.exp() * (log_b - log_u)).sum(-1).mean() / LN2
        stats["bias_norm"] = b.norm(dim=-1).mean().item()
        stats["bias_kl"] = max(0.0, kl.item())  # KL >= 0; float error printed "-0"
    return stats


def divergence_sums(
    log_probs: torch.Tensor,
    mask: torch.Tensor,
    log_prior: torch.Tensor,
    chunk_elements: int = CHUNK_ELEMENTS,
    prior_rows: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sums over the positions where ``mask`` is true of KL(p || unigram) and
    KL(p || uniform), in nats, and the number of those positions: float32
    tensors on ``log_probs``' device (no host synchronisation), computed a
    chunk of rows at a time::

        KL(p || q) = sum_v p(v) log p(v) - sum_v p(v) log q(v)

    ``prior_rows`` (shaped as ``mask``): each position's row of a
    ``log_prior`` with one row per target language."""
    vocab = log_probs.size(-1)
    log_p = log_probs.detach().reshape(-1, vocab)
    weights = mask.reshape(-1)
    log_u = head.all_rows(log_prior.to(log_p.device, torch.float32)).T  # (|V|, rows)
    if prior_rows is None:  # one prior: row 0 at every position
        prior_rows = torch.zeros(log_p.size(0), dtype=torch.long, device=log_p.device)
    prior_rows = prior_rows.reshape(-1, 1)
    rows = max(1, chunk_elements // vocab)
    kl_unigram = kl_uniform = log_p.new_zeros((), dtype=torch.float32)
    for start in range(0, log_p.size(0), rows):
        chunk = log_p[start : start + rows].float()
        p = chunk.exp()
        neg_entropy = (p * chunk).sum(-1)
        w = weights[start : start + rows].to(torch.float32)
        cross = torch.matmul(p, log_u).gather(1, prior_rows[start : start + rows])[:, 0]
        kl_unigram = kl_unigram + ((neg_entropy - cross) * w).sum()
        kl_uniform = kl_uniform + ((neg_entropy + math.log(vocab)) * w).sum()
    return kl_unigram, kl_uniform, weights.sum().to(torch.float32)
