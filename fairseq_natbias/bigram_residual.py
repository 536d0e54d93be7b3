"""The decoder's bigram residual (``--natbias-order 2``): logits

    g W phi + b + beta D[v]

where v is the decoder's input token at that position (the previous target;
EOS at position 0), D the fixed Witten-Bell table of
:mod:`fairseq_natbias.bigram` and beta a learnt scalar starting at 1. A fresh
model (g = 0.05, b = log p) predicts the Witten-Bell bigram; the network
learns the residual (Li et al., 2022). Where v was never seen in training, D's
row is empty and the model is the order-1 one.

Sparse: only the seen pairs are stored (CSR by v) and added, by one
``index_add_`` into the logits fairseq's output projection has just made; no
(tokens x |V|) copy of the table is made. The table is in the state dict
(buffers ``decoder.bigram_residual.{indptr,indices,values}``), so
fairseq-generate, the hub and checkpoint averaging need no training data; a
model built to load a checkpoint starts with an empty table that takes the
checkpoint's shape on loading. The values and beta stay float32 under
``--fp16``/``--bf16``: beta D is formed in float32 and rounded once, where it
is added to the logits (which are in the model's dtype, as fairseq's are).

The residual needs the decoder's input tokens, which fairseq's output
projection never sees, and fairseq calls ``decoder.forward`` directly (the
sequence generator), so neither a submodule nor a hook can add it. The
decoder's class is therefore swapped for its subclass with
:class:`BigramResidualDecoder` (fairseq builds the language model's decoder
itself, so subclassing at build time is not open to us); its parameters and
buffers are the decoder's own plus ``bigram_residual``.
"""

from typing import Optional

import torch
from fairseq.models.transformer import TransformerDecoder, TransformerDecoderBase
from torch import nn


class BigramResidual(nn.Module):
    """``beta D[v]`` added to the logits at the positions whose input is v."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.register_buffer("indptr", indptr.to(torch.int64))
        self.register_buffer("indices", indices.to(torch.int64))
        self.register_buffer("values", values.to(torch.float32))
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float32))

    @classmethod
    def placeholder(cls, vocab_size: int) -> "BigramResidual":
        """An empty table for a model whose checkpoint will fill it."""
        return cls(torch.zeros(vocab_size + 1, dtype=torch.int64),
                   torch.zeros(0, dtype=torch.int64), torch.zeros(0))

    @property
    def vocab_size(self) -> int:
        return len(self.indptr) - 1

    def forward(self, logits: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Add beta D[previous] to ``logits`` (..., |V|) in place; returns them.

        For the N positions, the entries of their rows are gathered as one
        flat list (position, column, value) and added with ``index_add_``:
        memory and time proportional to the seen pairs of those rows."""
        vocab = logits.shape[-1]
        if vocab != self.vocab_size:
            raise ValueError(f"the bigram table has {self.vocab_size} rows, the logits "
                             f"{vocab} entries")
        rows = previous.reshape(-1)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        total = int(lengths.sum())
        if total == 0:
            return logits
        positions = torch.repeat_interleave(torch.arange(len(rows), device=rows.device), lengths,
                                            output_size=total)
        row_offsets = torch.cumsum(lengths, 0) - lengths
        entries = (torch.arange(total, device=rows.device)
                   - row_offsets[positions] + starts[positions])
        columns = self.indices[entries]
        added = (self.weight * self.values[entries]).to(logits.dtype)
        flat = logits.view(-1)  # fairseq's projection output is contiguous
        flat.index_add_(0, positions * vocab + columns, added)
        return logits

    def replace_table(self, indptr: torch.Tensor, indices: torch.Tensor,
                      values: torch.Tensor) -> None:
        """Another table of the same vocabulary (the prior swapped); beta kept."""
        if len(indptr) != len(self.indptr):
            raise ValueError(f"the new table has {len(indptr) - 1} rows, the model "
                             f"{self.vocab_size}")
        device = self.indptr.device
        self.indptr = indptr.to(device, torch.int64)
        self.indices = indices.to(device, torch.int64)
        self.values = values.to(device, torch.float32)

    def _apply(self, fn, *args, **kwargs):
        # The table and beta stay float32 when the model is cast to half.
        kept = {"values": self._buffers.pop("values")}
        weight = self._parameters.pop("weight")
        try:
            module = super()._apply(fn, *args, **kwargs)
        finally:
            device = self.indptr.device
            self._buffers["values"] = kept["values"].to(device, torch.float32)
            weight.data = weight.data.to(device, torch.float32)
            self._parameters["weight"] = weight
        return module

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A placeholder table takes the saved one's size before it is copied.
        for name in ("indices", "values"):
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape != self._buffers[name].shape:
                self._buffers[name] = torch.empty(saved.shape, dtype=self._buffers[name].dtype,
                                                  device=self._buffers[name].device)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"rows={self.vocab_size}, pairs={len(self.indices)}"


class BigramResidualDecoder:
    """Mixin over a fairseq transformer decoder: its logits get the bigram
    residual of its input tokens (under incremental decoding the last one,
    the token whose successor is being scored)."""

    bigram_residual: BigramResidual

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only: bool = False, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out,
                                   incremental_state=incremental_state,
                                   features_only=features_only, **kwargs)
        if features_only:
            return x, extra
        previous = prev_output_tokens[:, -1:] if incremental_state is not None else prev_output_tokens
        return self.bigram_residual(x, previous), extra


class TransformerDecoderBaseWithBigram(BigramResidualDecoder, TransformerDecoderBase):
    """The translation model's decoder (fairseq's ``TransformerDecoderBase``)."""


class TransformerDecoderWithBigram(BigramResidualDecoder, TransformerDecoder):
    """The language model's decoder (fairseq's legacy ``TransformerDecoder``)."""


WITH_BIGRAM = {TransformerDecoderBase: TransformerDecoderBaseWithBigram,
               TransformerDecoder: TransformerDecoderWithBigram}


def attach_bigram_residual(decoder, residual: BigramResidual) -> None:
    """Give ``decoder`` the residual (see the module docstring for why its
    class changes)."""
    subclass = WITH_BIGRAM.get(type(decoder))
    if subclass is None:
        raise ValueError(f"--natbias-order 2 supports fairseq's transformer decoders, "
                         f"not {type(decoder).__name__}; use --natbias-order 1")
    decoder.__class__ = subclass
    decoder.bigram_residual = residual


def bigram_residual(decoder) -> Optional[BigramResidual]:
    return getattr(decoder, "bigram_residual", None)
