"""The decoder's bigram residual (``--natbias-order 2``, experimental): logits

    g W phi + b + beta D[v]

with v the decoder's input token at that position (the previous target), D
the fixed Witten-Bell table of :mod:`natbias.bigram` and beta a learnt scalar
starting at 1: a fresh model predicts the Witten-Bell bigram and the network
learns the residual (Li et al., 2022). Unseen rows of D are empty.

D is sparse (CSR by v), its few long rows also held dense
(:data:`DENSE_ROW_FRACTION`). The table is in the state dict, so generation
needs no training data.

Leave-one-out in training: the table was counted on the very targets the
network trains on, which it scores ~1.15 bits better than held-out ones at
3,000 pairs (research/studies/bigram.md). So in training each position sees
the table counted without its own target y after v (c = c(v, y), T = T(v),
T' = T - [c = 1])::

    D'[v, y]  = log(1 + (e^D[v, y] - 1) (c - 1) T / (c T'))
    D'[v, y'] = log(1 + (e^D[v, y'] - 1) T / T')                    (y' != y)

Validation, generation and scoring use the full table. Dense rows get the
target's own entry left out but keep T (their other entries would move by at
most log(1 + 8 / |V|)).

fairseq calls ``decoder.forward`` directly and its output projection never
sees the input tokens, so the decoder is a subclass with
:class:`BigramResidualDecoder`: built so by the translation model (fairseq's
``build_decoder`` hook); the language model's, which fairseq builds without
a hook, has its class changed (the plugin's one such place).
"""

from typing import Optional

import torch
from fairseq.models.transformer import TransformerDecoder, TransformerDecoderBase
from torch import nn

from natbias.errors import NaturalBiasError
from natbias.projection import KeepsFloat32

# A row with at least |V| / DENSE_ROW_FRACTION seen continuations is also kept
# dense: gathering its entries one by one costs several int64 passes per
# entry, a dense row one float32 pass per vocabulary entry, so past about
# |V|/8 entries the dense row is cheaper. Only the most frequent previous
# tokens (EOS, punctuation, "the") have such rows.
DENSE_ROW_FRACTION = 8


# Dense rows are gathered this many positions at a time: a few MiB that the
# allocator reuses, where one (positions x |V|) gather would be a fresh
# allocation as large as the logits (page faults cost more than the copy).
DENSE_CHUNK = 64


def _chunks(positions, ids):
    for start in range(0, len(positions), DENSE_CHUNK):
        yield positions[start : start + DENSE_CHUNK], ids[start : start + DENSE_CHUNK]


class _AddResidual(torch.autograd.Function):
    """``logits += beta * D[previous]`` in place, from the sparse entries
    (flat indices into the logits, values) and the dense rows (positions,
    row ids). The backward hands the logits' gradient through untouched and
    reduces beta's in float32 over the same entries: an in-place add into a
    view of the logits would make autograd copy the whole (tokens x |V|)
    gradient twice."""

    @staticmethod
    def forward(ctx, logits, beta, flat_index, values, dense_positions, dense_ids, dense_rows):
        vocab = logits.shape[-1]
        flat = logits.view(-1)
        flat.index_add_(0, flat_index, (beta * values).to(logits.dtype))
        by_position = flat.view(-1, vocab)
        for positions, ids in _chunks(dense_positions, dense_ids):
            by_position.index_add_(
                0, positions, dense_rows.index_select(0, ids).to(logits.dtype), alpha=float(beta)
            )
        ctx.mark_dirty(logits)
        ctx.save_for_backward(flat_index, values, dense_positions, dense_ids, dense_rows)
        return logits

    @staticmethod
    def backward(ctx, grad):
        grad_beta = None
        if ctx.needs_input_grad[1]:
            flat_index, values, dense_positions, dense_ids, dense_rows = ctx.saved_tensors
            flat = grad.reshape(-1)
            grad_beta = torch.dot(flat[flat_index].float(), values)
            by_position = flat.view(-1, grad.shape[-1])
            for positions, ids in _chunks(dense_positions, dense_ids):
                grad_beta = grad_beta + torch.dot(
                    by_position.index_select(0, positions).float().view(-1),
                    dense_rows.index_select(0, ids).view(-1),
                )
            grad_beta = grad_beta.reshape(1)  # beta's shape
        return grad, grad_beta, None, None, None, None, None


class BigramResidual(KeepsFloat32):
    """``beta D[v]`` added to the logits at the positions whose input is v."""

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Optional[torch.Tensor] = None,
    ):
        super().__init__()
        # beta, of shape (1,): FSDP shards no 0-d parameter (format 1 saved it 0-d).
        self.weight = nn.Parameter(torch.ones(1, dtype=torch.float32))
        self._set_table(indptr, indices, values, counts, indices.device)

    def _set_table(self, indptr, indices, values, counts, device) -> None:
        self.register_buffer("indptr", indptr.to(device, torch.int64))
        self.register_buffer("indices", indices.to(device, torch.int64))
        self.register_buffer("values", values.to(device, torch.float32))
        # c(v, y) per entry, for leaving each target out in training; empty
        # after the prior is swapped (the text's counts are not the training's).
        counts = torch.zeros(0) if counts is None else counts
        self.register_buffer("counts", counts.to(device, torch.float32))
        self._split_dense_rows()

    @classmethod
    def placeholder(cls, vocab_size: int) -> "BigramResidual":
        """An empty table for a model whose checkpoint will fill it."""
        empty = torch.zeros(0, dtype=torch.int64)
        return cls(torch.zeros(vocab_size + 1, dtype=torch.int64), empty, empty)

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1

    def _split_dense_rows(self) -> None:
        """Derived from the CSR table (not saved): the long rows as dense
        float32 rows, their slot per previous token (-1: sparse), and the
        sparse length of every row (0 for the dense ones)."""
        vocab, device = self.vocab_size, self.indptr.device
        lengths = self.indptr[1:] - self.indptr[:-1]
        dense = torch.nonzero(lengths >= max(1, vocab // DENSE_ROW_FRACTION)).flatten()
        slot = torch.full((vocab,), -1, dtype=torch.int64, device=device)
        slot[dense] = torch.arange(len(dense), device=device)
        rows = torch.zeros(len(dense), vocab, dtype=torch.float32, device=device)
        counts = torch.zeros(
            len(dense) if self.leaves_one_out else 0, vocab, dtype=torch.float32, device=device
        )
        for i, v in enumerate(dense.tolist()):
            span = slice(int(self.indptr[v]), int(self.indptr[v + 1]))
            rows[i, self.indices[span]] = self.values[span]
            if self.leaves_one_out:
                counts[i, self.indices[span]] = self.counts[span]
        self.register_buffer("dense_slot", slot, persistent=False)
        self.register_buffer("dense_rows", rows, persistent=False)
        self.register_buffer("dense_counts", counts, persistent=False)
        self.register_buffer("sparse_lengths", torch.where(slot >= 0, 0, lengths), persistent=False)

    @property
    def leaves_one_out(self) -> bool:
        return len(self.counts) == len(self.indices) > 0

    def forward(
        self, logits: torch.Tensor, previous: torch.Tensor, targets: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Add beta D[previous] to ``logits`` (..., |V|) in place; returns them.
        With ``targets`` (each position's next token, -1 where not known;
        training) and the counts known, each position's own target is left
        out of the table (the module docstring).

        Sparse rows: the entries of the N positions' rows are gathered as
        one flat list (position, column, value). Dense rows (the long ones):
        gathered whole. Memory and time: the seen pairs of the sparse rows
        plus |V| per position with a dense row."""
        vocab = logits.shape[-1]
        if vocab != self.vocab_size:
            raise ValueError(
                f"the bigram table has {self.vocab_size} rows, the logits {vocab} entries"
            )
        logits = logits.contiguous()  # itself where it is already
        rows = previous.reshape(-1)
        lengths = self.sparse_lengths[rows]
        total = int(lengths.sum())
        positions = torch.repeat_interleave(
            torch.arange(len(rows), device=rows.device), lengths, output_size=total
        )
        row_offsets = torch.cumsum(lengths, 0) - lengths
        entries = (
            torch.arange(total, device=rows.device)
            - row_offsets[positions]
            + self.indptr[rows][positions]
        )
        columns = self.indices[entries]
        flat_index = positions * vocab + columns
        values = self.values[entries]
        dense_slot = self.dense_slot[rows]
        dense_positions = torch.nonzero(dense_slot >= 0).flatten()
        if targets is not None and self.leaves_one_out:
            flat_index, values = self._leave_one_out(
                rows, targets, positions, entries, columns, flat_index, values, dense_slot
            )
        return _AddResidual.apply(
            logits,
            self.weight,
            flat_index,
            values,
            dense_positions,
            dense_slot[dense_positions],
            self.dense_rows,
        )

    def _leave_one_out(
        self, rows, targets, positions, entries, columns, flat_index, values, dense_slot
    ):
        """The gathered sparse entries with each position's target left out
        (module docstring), plus one correcting entry per position whose row
        is dense and holds its target. A sparse row's target entry is found
        among the entries already gathered, a dense row's in its dense counts."""
        targets = targets.reshape(-1)
        is_target = columns == targets[positions]
        count = torch.zeros(len(rows), dtype=torch.float32, device=rows.device)
        count.index_add_(0, positions[is_target], self.counts[entries[is_target]])
        dense = torch.nonzero((dense_slot >= 0) & (targets >= 0)).flatten()
        count[dense] = self.dense_counts[dense_slot[dense], targets[dense]]
        distinct = self.sparse_lengths[rows].to(torch.float32)  # T(v); 0 for dense rows (T kept)
        singleton = (count == 1) & (distinct > 1)
        row_factor = torch.where(singleton, distinct / (distinct - 1), torch.ones_like(distinct))
        own_factor = (count - 1).clamp(min=0) / count.clamp(min=1)  # 1 - 1/c; 0 when c = 1
        # Sparse rows: every entry of a row that lost a continuation, and the target's own.
        factor = row_factor[positions] * torch.where(is_target, own_factor[positions], 1.0)
        values = torch.where(factor != 1, torch.log1p(torch.expm1(values) * factor), values)
        # Dense rows: the target's own entry only (T kept).
        fix = dense[count[dense] > 0]
        own = self.dense_rows[dense_slot[fix], targets[fix]]
        correction = torch.log1p(torch.expm1(own) * own_factor[fix]) - own
        return (
            torch.cat([flat_index, fix * self.vocab_size + targets[fix]]),
            torch.cat([values, correction]),
        )

    def replace_table(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        values: torch.Tensor,
        counts: Optional[torch.Tensor] = None,
    ) -> None:
        """Another table of the same vocabulary (the prior swapped); beta kept."""
        if len(indptr) != len(self.indptr):
            raise ValueError(
                f"the new table has {len(indptr) - 1} rows, the model {self.vocab_size}"
            )
        self._set_table(indptr, indices, values, counts, self.indptr.device)

    # The table, its dense rows and beta stay float32 when the model is cast
    # to half; they only move device.
    float32_parameters = ("weight",)
    float32_buffers = ("values", "dense_rows", "counts", "dense_counts")

    def _float32_device(self) -> torch.device:
        return self.indptr.device

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A placeholder table takes the saved one's size before it is copied;
        # the dense rows are derived again from what was loaded.
        for name in ("indices", "values", "counts"):
            saved, buffer = state_dict.get(prefix + name), self._buffers[name]
            if saved is not None and saved.shape != buffer.shape:
                self._buffers[name] = buffer.new_empty(saved.shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._split_dense_rows()

    def extra_repr(self) -> str:
        return (
            f"rows={self.vocab_size}, pairs={len(self.indices)}, dense rows={len(self.dense_rows)}"
        )


class BigramResidualDecoder:
    """Mixin over a fairseq transformer decoder: its logits get the bigram
    residual of its input tokens (under incremental decoding the last one,
    the token whose successor is being scored)."""

    bigram_residual: BigramResidual
    # Translation: the target after the last input token is EOS. A language
    # model's is the first token of the next block, not known here.
    eos_ends_the_input = True

    def next_tokens(self, prev_output_tokens):
        """Each position's target, read off the decoder's input (shifted by
        one), -1 where it is not known (padding; a language model's last)."""
        following = torch.full_like(prev_output_tokens, -1)
        following[:, :-1] = prev_output_tokens[:, 1:]
        following[following == self.padding_idx] = -1
        real = prev_output_tokens != self.padding_idx
        if self.eos_ends_the_input:  # a real token followed by nothing: the last
            following = torch.where(real & (following == -1), self.dictionary.eos(), following)
        return torch.where(real, following, -1)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out, incremental_state, **kwargs)
        if kwargs.get("features_only", False):
            return x, extra
        if incremental_state is not None:
            return self.bigram_residual(x, prev_output_tokens[:, -1:]), extra
        targets = self.next_tokens(prev_output_tokens) if self.training else None
        return self.bigram_residual(x, prev_output_tokens, targets), extra


class TransformerDecoderBaseWithBigram(BigramResidualDecoder, TransformerDecoderBase):
    """The translation model's decoder (fairseq's ``TransformerDecoderBase``)."""


class TransformerDecoderWithBigram(BigramResidualDecoder, TransformerDecoder):
    """The language model's decoder (fairseq's legacy ``TransformerDecoder``)."""

    eos_ends_the_input = False


WITH_BIGRAM = {
    TransformerDecoderBase: TransformerDecoderBaseWithBigram,
    TransformerDecoder: TransformerDecoderWithBigram,
}


def attach_bigram_residual(decoder, residual: BigramResidual) -> None:
    """Give ``decoder`` the residual (see the module docstring for why its
    class may change)."""
    subclass = WITH_BIGRAM.get(type(decoder), type(decoder))
    if not issubclass(subclass, BigramResidualDecoder):
        raise NaturalBiasError(
            f"--natbias-order 2 supports fairseq's transformer decoders, "
            f"not {type(decoder).__name__}; use --natbias-order 1"
        )
    decoder.__class__ = subclass
    decoder.bigram_residual = residual


def bigram_residual(decoder) -> Optional[BigramResidual]:
    return getattr(decoder, "bigram_residual", None)
