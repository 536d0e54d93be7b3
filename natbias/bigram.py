"""Target-side bigram statistics for ``--natbias-order 2``: pair counts and
the fixed Witten-Bell residual table the decoder adds to its logits.

The paper's discussion (Meister et al., 2023, sec. 7) names "higher-order
statistical models, such as a bigram" as the next step; Li et al. (2022)
train the network on the residual of a fixed n-gram model. Here the n-gram
model is the interpolated Witten-Bell bigram of the training targets::

    p_WB(y | v) = lam(v) c(v, y) / c(v) + (1 - lam(v)) p(y),
    lam(v)      = c(v) / (c(v) + T(v))

with c(v, y) the count of target y after input token v, c(v) = sum_y c(v, y),
T(v) the number of distinct y seen after v, and p the add-alpha unigram the
bias starts from (:func:`natbias.prior.log_unigram`). Since
lam / ((1 - lam) c(v)) = 1 / T(v),

    log p_WB(y | v) = log p(y) + D[v, y] + log(1 - lam(v)),
    D[v, y]         = log(1 + c(v, y) / (T(v) p(y)))   >= 0, 0 for unseen pairs

and the row constant log(1 - lam(v)) cancels in the softmax: a model whose
logits are ``b + D[v]`` with b = log p predicts p_WB exactly. D is stored
sparse (CSR by v: only the seen pairs), so its size is the number of distinct
pairs, never |V|^2.

What is counted: the stream of target tokens the unigram counts, each token paired with the one before it,
the first with EOS. That is what the decoder sees as its input: translation
targets are fed as ``EOS y1 ... yn`` after a sentence that ended in EOS, and
fairseq's language-model blocks take the stream token before each target
as its input (EOS before the first).
"""

from dataclasses import dataclass

import numpy as np
import torch

# Pairs held unmerged before they are folded into the running counts; the
# merge happens when the pending pairs outnumber the merged ones, so the total
# work is O(n log n) and the memory a small multiple of the distinct pairs.
MIN_PENDING_PAIRS = 1 << 22


class PairCounter:
    """Counts of (previous, next) token pairs over one or more token streams,
    in memory bounded by the number of distinct pairs (plus one chunk).

    Feed each stream in chunks with :meth:`add`, starting each stream with
    :meth:`start_stream`; pairs are keyed ``previous * vocab_size + next``."""

    def __init__(self, vocab_size: int, eos: int):
        self.vocab_size = int(vocab_size)
        self.eos = int(eos)
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending = []
        self._pending_pairs = 0
        self._previous = self.eos

    def start_stream(self) -> None:
        """The next token read is the first of a stream: EOS comes before it."""
        self._previous = self.eos

    def add(self, tokens: np.ndarray) -> None:
        """Count the pairs ending in ``tokens`` (the next chunk of the stream)."""
        if tokens.size == 0:
            return
        tokens = tokens.astype(np.int64, copy=False)
        previous = np.concatenate(([self._previous], tokens[:-1]))
        self._previous = int(tokens[-1])
        keys, counts = np.unique(previous * self.vocab_size + tokens, return_counts=True)
        self._pending.append((keys, counts))
        self._pending_pairs += len(keys)
        if self._pending_pairs > max(len(self.keys), MIN_PENDING_PAIRS):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self.keys] + [k for k, _ in self._pending])
        counts = np.concatenate([self.counts] + [c for _, c in self._pending])
        self._pending, self._pending_pairs = [], 0
        order = np.argsort(keys, kind="stable")
        keys, counts = keys[order], counts[order]
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        self.keys, self.counts = keys[starts], np.add.reduceat(counts, starts)

    def table(self) -> "BigramCounts":
        self._merge()
        previous = self.keys // self.vocab_size
        indptr = np.zeros(self.vocab_size + 1, dtype=np.int64)
        np.cumsum(np.bincount(previous, minlength=self.vocab_size), out=indptr[1:])
        return BigramCounts(indptr, self.keys % self.vocab_size, self.counts.copy())


@dataclass
class BigramCounts:
    """c(v, y) in CSR form: row v's seen continuations are
    ``indices[indptr[v]:indptr[v + 1]]`` (ascending) with ``counts`` alike."""

    indptr: np.ndarray
    indices: np.ndarray
    counts: np.ndarray

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1


def witten_bell_values(pairs: BigramCounts, log_p: np.ndarray) -> np.ndarray:
    """D[v, y] = log(1 + c(v, y) / (T(v) p(y))) for the seen pairs (module
    docstring), float64, aligned with ``pairs.indices``; ``log_p`` is log p
    over the whole vocabulary (float64)."""
    distinct = np.diff(pairs.indptr)  # T(v) for every row, repeated per entry below
    continuations = np.repeat(distinct, distinct).astype(np.float64)
    return np.log1p(pairs.counts / (continuations * np.exp(log_p[pairs.indices])))


def witten_bell_residual(pairs: BigramCounts, log_unigram: torch.Tensor):
    """The Witten-Bell residual (:func:`witten_bell_values`) as float32 CSR
    arrays ``(indptr, indices, values)``; computed in float64. ``log_unigram``
    is log p, the smoothed unigram of the bias."""
    if len(log_unigram) != pairs.vocab_size:
        raise ValueError(
            f"the unigram has {len(log_unigram)} entries, the bigram counts {pairs.vocab_size}"
        )
    values = witten_bell_values(pairs, log_unigram.detach().double().cpu().numpy())
    return (
        torch.from_numpy(pairs.indptr.copy()),
        torch.from_numpy(pairs.indices.copy()),
        torch.from_numpy(values.astype(np.float32)),
    )
