r"""Eq. (4) made exact: each token's log-probability split into a context term,
a frequency term (the output bias) and a normaliser. With logits ``g W phi + b``
(Meister et al., 2023, sec. 2.2)::

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)      (4)

    log p_theta(y) = log p_Wphi(y) + log p_b(y) - log sum_v p_Wphi(v) p_b(v)
                     \__context__/   \frequency/   \_____normaliser_______/

an identity, computed in float32 from the model's own forward pass, without
the generation-time controls. Without an output bias the context term is the
whole log-probability. Usage: examples/python_api/decompose.py.
"""

import os
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

from fairseq_natbias.checkpoint_loading import CheckpointError
from fairseq_natbias.natural_bias import check_natbias_checkpoint  # re-exported for users
from natbias.errors import NaturalBiasError

NO_BIAS_NOTE = (
    "the model has no output bias (--natbias-init none): all of "
    "log p(y) is context; the frequency and normaliser terms are 0"
)
BIGRAM_NOTE = (
    "--natbias-order 2: the context term includes the bigram residual "
    "beta*D[previous token] (the frequency term is the unigram bias b alone)"
)
COLUMNS = ("log_p", "context", "frequency", "normaliser")


class Terms(NamedTuple):
    """Per target token: ``log_p = context + frequency + normaliser``."""

    log_p: torch.Tensor
    context: torch.Tensor
    frequency: torch.Tensor
    normaliser: torch.Tensor


def decompose_logits(
    logits: torch.Tensor, bias: Optional[torch.Tensor], target: torch.Tensor
) -> Terms:
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
    log_p_bias = torch.log_softmax(bias, dim=-1)  # log softmax(b)
    # -log sum_v p_Wphi(v) p_b(v), in log space (no underflow for rare v).
    normaliser = -torch.logsumexp(log_p_context + log_p_bias, dim=-1)
    frequency = log_p_bias[target]
    return Terms(at_target(log_p_full), at_target(log_p_context), frequency, normaliser)


@dataclass
class Decomposition:
    """One teacher-forced target sentence, per token (1-D float32 tensors)."""

    tokens: torch.Tensor
    symbols: list[str]
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

    def format_table(self, symbol_width: int = 16) -> str:
        """A fixed-width table: one row per token, then their sums."""
        lines = [f"{'t':>3}  {'token':<{symbol_width}}" + "".join(f"{c:>12}" for c in COLUMNS)]
        for t, symbol in enumerate(self.symbols):
            lines.append(
                f"{t + 1:>3}  {symbol[:symbol_width]:<{symbol_width}}"
                + "".join(f"{float(getattr(self, c)[t]):>12.4f}" for c in COLUMNS)
            )
        sums = [float(getattr(self, c).double().sum()) for c in COLUMNS]
        lines.append(f"{'':>3}  {'sum':<{symbol_width}}" + "".join(f"{s:>12.4f}" for s in sums))
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)


def decompose(model, target: torch.Tensor, source: Optional[torch.Tensor] = None) -> Decomposition:
    """Teacher-force ``target`` (1-D token ids ending in EOS, e.g. a hypothesis's
    ``tokens``) through ``model`` and decompose each token (eq. 4). ``source``:
    the source ids of a translation model; None for a language model, whose
    input is the target shifted right after an EOS."""
    decoder = getattr(model, "decoder", None)
    if getattr(decoder, "output_projection", None) is None:
        raise NaturalBiasError(
            f"{type(model).__name__} has no decoder.output_projection (an adaptive "
            "softmax?): decompose a transformer_natbias or transformer_lm_natbias model"
        )
    target, net_input = _teacher_forcing(model, decoder, target, source)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(**net_input)[0][0]
    finally:
        model.train(was_training)
    bias = decoder.output_projection.bias
    terms = decompose_logits(logits, bias, target)
    gain = decoder.output_projection.gain()
    dictionary = decoder.dictionary
    return Decomposition(
        tokens=target.cpu(),
        symbols=[dictionary[int(i)] for i in target],
        **{name: value.cpu() for name, value in terms._asdict().items()},
        gain=None if gain is None else float(gain.detach()),
        has_bias=bias is not None,
        note=(
            NO_BIAS_NOTE
            if bias is None
            else BIGRAM_NOTE
            if getattr(decoder, "bigram_residual", None) is not None
            else None
        ),
    )


def _teacher_forcing(model, decoder, target, source):
    from fairseq.models import FairseqEncoderDecoderModel

    device = next(model.parameters()).device
    target = torch.as_tensor(target, dtype=torch.long, device=device)
    vocab = decoder.output_projection.out_features
    if target.dim() != 1 or target.numel() == 0:
        raise NaturalBiasError("target: give one sentence as a non-empty 1-D tensor of token ids")
    if int(target.max()) >= vocab or int(target.min()) < 0:
        raise NaturalBiasError(
            f"target holds token id {int(target.max())}, the model's "
            f"vocabulary has {vocab}: encode it with the model's dictionary"
        )
    eos = decoder.dictionary.eos()
    shifted = torch.cat([target.new_tensor([eos]), target[:-1]]).unsqueeze(0)
    if isinstance(model, FairseqEncoderDecoderModel):
        if source is None:
            raise NaturalBiasError(
                "a translation model needs the source sentence too (source=hub.encode(text))"
            )
        source = torch.as_tensor(source, dtype=torch.long, device=device).view(1, -1)
        lengths = torch.tensor([source.shape[1]], device=device)
        return target, {"src_tokens": source, "src_lengths": lengths, "prev_output_tokens": shifted}
    if source is not None:
        raise NaturalBiasError("a language model has no source: give the target alone")
    return target, {"src_tokens": shifted}


def load_hub(model_class, checkpoint: str, data: str, **overrides):
    """fairseq's hub interface (``from_pretrained``) of ``checkpoint`` with the
    data directory holding its dictionaries, in eval mode; ``overrides`` go to
    ``from_pretrained`` (the model's settings, a BPE). A data directory it
    cannot use is a CheckpointError too."""
    if not os.path.isdir(data):
        raise CheckpointError(
            f"{data}: no such data directory; give the fairseq-preprocess "
            "output the model was trained on (its dict.*.txt)"
        )
    folder, name = os.path.split(os.path.abspath(checkpoint))
    try:
        # An absolute data path: fairseq reads one starting with "." as
        # relative to the checkpoint's folder.
        hub = model_class.from_pretrained(
            folder, name, data_name_or_path=os.path.abspath(data), **overrides
        )
    except FileNotFoundError as error:
        raise CheckpointError(
            f"{data}: {error.strerror or error}: {error.filename or ''}; "
            "give the data directory the model was trained on"
        ) from None
    except RuntimeError as error:
        if "size mismatch" not in str(error):
            raise
        raise CheckpointError(
            f"mismatched dictionaries: {checkpoint} was trained with other dictionaries "
            f"than those in {data}; use the data directory the model was trained on"
        ) from None
    hub.eval()
    return hub


def load_model(checkpoint: str, data: str, sentencepiece_model: Optional[str] = None, **overrides):
    """fairseq's hub interface for a fairseq_natbias checkpoint with its data
    directory and, for text in and out, its SentencePiece model."""
    _, model_class = check_natbias_checkpoint(checkpoint)
    if sentencepiece_model is not None:
        if not os.path.isfile(sentencepiece_model):
            raise NaturalBiasError(
                f"{sentencepiece_model}: no such SentencePiece model; give "
                "the .model file the training text was encoded with"
            )
        overrides.update(
            bpe="sentencepiece", sentencepiece_model=os.path.abspath(sentencepiece_model)
        )
    return load_hub(model_class, checkpoint, data, **overrides)
