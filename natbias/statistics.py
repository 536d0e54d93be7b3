"""How far the output bias and the model are from the target unigram: the
statistics of the paper's App. A.6 (Figs. 13, 14) and Fig. 1, in bits, each
defined in docs/options.md#the-training-log and listed in :mod:`natbias.metrics`.
"""

import math

import torch

from natbias import head
from natbias.sharding import full

LN2 = math.log(2.0)  # nats per bit: every figure in bits divides by it
# float32 entries per temporary of the per-token divergences (32 MiB), so that
# 8k tokens x a 32k vocabulary never need two such tensors whole.
CHUNK_ELEMENTS = 1 << 23


class Statistics:
    """Every statistic of one log line, read in bits by :meth:`bits`."""

    def __init__(self, chunk_elements: int = CHUNK_ELEMENTS, dtype=torch.float32):
        self.chunk_elements, self.dtype = chunk_elements, dtype  # dtype: of the running sums
        self.sums, self.values = {}, {}  # nats over target tokens ("tokens": how many)

    def add(self, log_probs, mask, log_prior=None, rows=None, targets=None) -> None:
        """Adds the sums over the positions where ``mask`` is true of
        KL(p || unigram) and KL(p || uniform) (with a prior; ``rows``: each
        position's row of a per-language one), a chunk of rows at a time::

            KL(p || q) = sum_v p(v) log p(v) - sum_v p(v) log q(v)

        and, given ``targets``, their cross-entropy under the model (``nll``)
        and the prior (``unigram_ce``). No host synchronisation."""
        vocab = log_probs.size(-1)
        log_p, weights = log_probs.detach().reshape(-1, vocab), mask.reshape(-1)
        sums, scores = {"tokens": weights.sum()}, {"nll": log_probs}
        if log_prior is not None:
            log_u = head.all_rows(log_prior.to(log_p.device, torch.float32)).T  # (|V|, rows)
            picks = torch.zeros_like(weights, dtype=torch.long) if rows is None else rows
            picks, step = picks.reshape(-1, 1), max(1, self.chunk_elements // vocab)
            kl_unigram = kl_uniform = log_p.new_zeros((), dtype=torch.float32)
            for start in range(0, log_p.size(0), step):
                chunk = log_p[start : start + step].float()
                p = chunk.exp()
                neg_entropy = (p * chunk).sum(-1)
                w = weights[start : start + step].to(torch.float32)
                cross = torch.matmul(p, log_u).gather(1, picks[start : start + step])[:, 0]
                kl_unigram = kl_unigram + ((neg_entropy - cross) * w).sum()
                kl_uniform = kl_uniform + ((neg_entropy + math.log(vocab)) * w).sum()
            sums.update(kl_unigram=kl_unigram, kl_uniform=kl_uniform)
            scores["unigram_ce"] = head.bias_rows(log_prior, rows).expand_as(log_probs)
        for key, each in scores.items() if targets is not None else ():
            sums[key] = -each.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[mask].sum()
        for key, value in sums.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.to(self.dtype)

    def add_head(self, bias, log_prior, weight, gain=None, bigram_weight=None) -> None:
        """``weight_norm``, and ``gain``, ``bias_kl``, ``bias_norm`` (mean over
        a per-language b's rows) and ``bigram_weight`` where it has g, b, beta.
        Sharded tensors are reduced or gathered: call it on every process then."""
        weight_norm = full(weight.detach().float().norm())
        if gain is not None:
            gain = full(gain.detach()).float().reshape(())
            weight_norm = weight_norm * gain.abs()
        self.values["weight_norm"] = weight_norm.item()
        if gain is not None:
            self.values["gain"] = gain.item()
        if bias is not None:
            b = head.all_rows(full(bias.detach()).float())
            log_b = b.log_softmax(-1)
            log_u = head.all_rows(log_prior.to(b.device, torch.float32))
            kl = (log_b.exp() * (log_b - log_u)).sum(-1).mean() / LN2
            self.values["bias_norm"] = b.norm(dim=-1).mean().item()
            self.values["bias_kl"] = max(0.0, kl.item())  # KL >= 0; float error printed "-0"
        if bigram_weight is not None:
            self.values["bigram_weight"] = bigram_weight.detach().float().item()

    def bits(self) -> dict[str, float]:
        """``values``, then each per-token sum / tokens / ln 2 (no tokens: 0)."""
        sums = dict(self.sums)
        tokens = max(float(sums.pop("tokens", 0.0)), 1.0)
        return {**self.values, **{key: float(s) / tokens / LN2 for key, s in sums.items()}}
