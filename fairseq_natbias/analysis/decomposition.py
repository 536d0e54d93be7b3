"""Eq. (4) made exact: how much of each token's log-probability comes from the
output bias (frequency) and how much from the contextual logits ``g W phi``.

Meister et al. (2023), sec. 2.2, with logits ``g W phi + b`` (g the learnt
gain of ``--natbias-weight-init gain``, 1 for the other inits)::

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)      (4)

Writing out the proportionality constant gives, for every token y::

    log p_theta(y) = log p_Wphi(y) + log p_b(y) - log sum_v p_Wphi(v) p_b(v)
                     \\__context__/   \\frequency/   \\_____normaliser_______/

with ``p_Wphi = softmax(g W phi)`` and ``p_b = softmax(b)``; an identity, not
an approximation. The normaliser depends on the context but not on y, so at
one position the log-probabilities of two candidate tokens differ by the
difference of their context terms plus that of their frequency terms. It is
never negative (``sum_v p_Wphi(v) p_b(v) <= max_v p_b(v) <= 1``), and when
``p_Wphi`` is uniform (a fresh model with the default gain 0.05 is close to
that) it is ``log |V|``, cancelling the context term ``-log |V|``: the model
then predicts ``p_b``, the unigram.

The terms are computed from the model's own forward pass (``net_output[0]``
are the logits ``g W phi + b``; minus b they are ``g W phi``), in float32
whatever the model's dtype. Generation-time controls loaded through
``--model-overrides`` / ``from_pretrained(..., natbias_bias_scale=...)`` are
not applied: this decomposes the trained model. A model without an output
bias (``--natbias-init none``) has frequency and normaliser terms 0, and its
context term is the whole log-probability.

    from fairseq_natbias.analysis import decomposition
    hub = decomposition.load_model("checkpoints/unigram/checkpoint_best.pt",
                                   "data-bin", sentencepiece_model="spm.model")
    source = hub.encode("Ein Mann fährt Fahrrad.")
    target = hub.generate(source, beam=5)[0]["tokens"]
    print(decomposition.decompose(hub.models[0], target, source).format_table())
"""

import os
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import torch

from fairseq_natbias.analysis import AnalysisError
from fairseq_natbias.checkpoint_loading import load_hub
# check_natbias_checkpoint is re-exported: the examples and users' scripts call it from here.
from fairseq_natbias.natural_bias import check_natbias_checkpoint

NO_BIAS_NOTE = ("the model has no output bias (--natbias-init none): all of "
                "log p(y) is context; the frequency and normaliser terms are 0")
BIGRAM_NOTE = ("--natbias-order 2: the context term includes the bigram residual "
               "beta*D[previous token] (the frequency term is the unigram bias b alone)")
COLUMNS = ("log_p", "context", "frequency", "normaliser")


# --- the identity, on logits ------------------------------------------------------


class Terms(NamedTuple):
    """Per target token: ``log_p = context + frequency + normaliser``."""

    log_p: torch.Tensor
    context: torch.Tensor
    frequency: torch.Tensor
    normaliser: torch.Tensor


def decompose_logits(logits: torch.Tensor, bias: Optional[torch.Tensor],
                     target: torch.Tensor) -> Terms:
    """The four terms for logits ``(..., V)`` = ``g W phi + b``, the bias
    ``(V,)`` (None: no bias) and target ids ``(...)``, in float32."""
    logits = logits.float()
    picked = target.unsqueeze(-1)

    def at_target(log_probs):
        return log_probs.gather(-1, picked).squeeze(-1)

    log_p_full = torch.log_softmax(logits, dim=-1)
    if bias is None:
        zeros = torch.zeros(target.shape, dtype=logits.dtype, device=logits.device)
        return Terms(at_target(log_p_full), at_target(log_p_full), zeros, zeros.clone())
    bias = bias.detach().float().to(logits.device)
    log_p_context = torch.log_softmax(logits - bias, dim=-1)  # log softmax(g W phi)
    log_p_bias = torch.log_softmax(bias, dim=-1)               # log softmax(b)
    # -log sum_v p_Wphi(v) p_b(v), in log space (no underflow for rare v).
    normaliser = -torch.logsumexp(log_p_context + log_p_bias, dim=-1)
    frequency = log_p_bias[target]
    return Terms(at_target(log_p_full), at_target(log_p_context), frequency, normaliser)


# --- one sentence through a model --------------------------------------------------


@dataclass
class Decomposition:
    """One teacher-forced target sentence, per token (1-D float32 tensors)."""

    tokens: torch.Tensor
    symbols: List[str]
    log_p: torch.Tensor
    context: torch.Tensor
    frequency: torch.Tensor
    normaliser: torch.Tensor
    gain: Optional[float]
    has_bias: bool
    note: Optional[str] = None

    def residual(self) -> torch.Tensor:
        """``log_p - (context + frequency + normaliser)``: zero up to rounding."""
        return self.log_p - (self.context + self.frequency + self.normaliser)

    def rows(self) -> List[dict]:
        return [{"position": t + 1, "token_id": int(self.tokens[t]), "symbol": self.symbols[t],
                 **{name: float(getattr(self, name)[t]) for name in COLUMNS}}
                for t in range(len(self.symbols))]

    def format_table(self, symbol_width: int = 16) -> str:
        """A fixed-width table: one row per token, then their sums."""
        header = f"{'t':>3}  {'token':<{symbol_width}}" + "".join(f"{c:>12}" for c in COLUMNS)
        lines = [header]
        for row in self.rows():
            symbol = row["symbol"][:symbol_width]
            lines.append(f"{row['position']:>3}  {symbol:<{symbol_width}}"
                         + "".join(f"{row[c]:>12.4f}" for c in COLUMNS))
        sums = [float(getattr(self, c).double().sum()) for c in COLUMNS]
        lines.append(f"{'':>3}  {'sum':<{symbol_width}}" + "".join(f"{s:>12.4f}" for s in sums))
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)


def decompose(model, target: torch.Tensor, source: Optional[torch.Tensor] = None) -> Decomposition:
    """Teacher-force ``target`` (1-D token ids, ending in EOS as fairseq
    binarises, e.g. a hypothesis's ``tokens``) through ``model`` and split each
    token's log-probability into context, frequency and normaliser (eq. 4).

    ``source``: 1-D source token ids for a translation model (``hub.encode``);
    None for a language model, whose input is the target shifted right after
    an EOS (fairseq's language_modeling task without ``--add-bos-token``).
    """
    decoder = _decoder_with_projection(model)
    target, net_input = _teacher_forcing(model, decoder, target, source)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(**net_input)[0][0]
    finally:
        model.train(was_training)
    from fairseq_natbias.output_projection import output_gain

    bias = decoder.output_projection.bias
    terms = decompose_logits(logits, bias, target)
    gain = output_gain(decoder)
    dictionary = decoder.dictionary
    return Decomposition(
        tokens=target.cpu(), symbols=[dictionary[int(i)] for i in target],
        **{name: value.cpu() for name, value in terms._asdict().items()},
        gain=None if gain is None else float(gain.detach()), has_bias=bias is not None,
        note=(NO_BIAS_NOTE if bias is None
              else BIGRAM_NOTE if getattr(decoder, "bigram_residual", None) is not None
              else None),
    )


def _decoder_with_projection(model):
    decoder = getattr(model, "decoder", None)
    if getattr(decoder, "output_projection", None) is None:
        raise AnalysisError(
            f"{type(model).__name__} has no decoder.output_projection (an adaptive "
            "softmax?): decompose a transformer_natbias or transformer_lm_natbias model")
    return decoder


def _teacher_forcing(model, decoder, target, source):
    from fairseq.models import FairseqEncoderDecoderModel

    device = next(model.parameters()).device
    target = torch.as_tensor(target, dtype=torch.long, device=device)
    vocab = decoder.output_projection.out_features
    if target.dim() != 1 or target.numel() == 0:
        raise AnalysisError("target: give one sentence as a non-empty 1-D tensor of token ids")
    if int(target.max()) >= vocab or int(target.min()) < 0:
        raise AnalysisError(f"target holds token id {int(target.max())}, the model's "
                            f"vocabulary has {vocab}: encode it with the model's dictionary")
    eos = decoder.dictionary.eos()
    shifted = torch.cat([target.new_tensor([eos]), target[:-1]]).unsqueeze(0)
    if isinstance(model, FairseqEncoderDecoderModel):
        if source is None:
            raise AnalysisError("a translation model needs the source sentence too "
                                "(source=hub.encode(text))")
        source = torch.as_tensor(source, dtype=torch.long, device=device).view(1, -1)
        lengths = torch.tensor([source.shape[1]], device=device)
        return target, {"src_tokens": source, "src_lengths": lengths,
                        "prev_output_tokens": shifted}
    if source is not None:
        raise AnalysisError("a language model has no source: give the target alone")
    return target, {"src_tokens": shifted}


# --- loading a checkpoint ----------------------------------------------------------


def load_model(checkpoint: str, data: str, sentencepiece_model: Optional[str] = None,
               **overrides):
    """fairseq's hub interface (``from_pretrained``) for a fairseq_natbias
    checkpoint with its data directory (the dictionaries) and, for text in
    and out, its SentencePiece model; ``overrides`` go to ``from_pretrained``."""
    _, model_class = check_natbias_checkpoint(checkpoint)
    if sentencepiece_model is not None:
        if not os.path.isfile(sentencepiece_model):
            raise AnalysisError(f"{sentencepiece_model}: no such SentencePiece model; give "
                                "the .model file the training text was encoded with")
        overrides.update(bpe="sentencepiece",
                         sentencepiece_model=os.path.abspath(sentencepiece_model))
    return load_hub(model_class, checkpoint, data, **overrides)
