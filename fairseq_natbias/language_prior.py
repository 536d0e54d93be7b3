"""One prior per target language (``--natbias-prior per-language``,
docs/options.md#multilingual-models): logits ``g W phi_t + b[row_t]``, row_t
that of the language token among the decoder's first two inputs at or before
t; positions before it (the one that predicts the language token, which no
language row counts) use row 0, the pooled prior.

fairseq calls ``decoder.forward`` directly and its output projection never
sees the input tokens, so the model builds its decoder as a subclass
(fairseq's ``build_decoder`` hook); which token selects which row is saved
in the model's config (``natbias_language_tokens``), not in its state.
"""

import torch
from fairseq.models.transformer import TransformerDecoderBase

from fairseq_natbias import training_data
from natbias.errors import NaturalBiasError

ROWS_KEY = "natbias_prior_rows"  # each position's row, in the decoder's extra output


class LanguagePriorDecoder(TransformerDecoderBase):
    """fairseq's transformer decoder whose logits add each position's row of the bias."""

    token_rows: torch.Tensor  # |V| entries: a language token's row, 0 for every other token

    def prior_rows(self, prev_output_tokens: torch.Tensor) -> torch.Tensor:
        """Each position's row: that of a language token among the first two
        inputs at or before it, else 0."""
        first = self.token_rows[prev_output_tokens[:, :2]]
        seen = first.cummax(dim=1).values
        rows = seen[:, -1:].expand_as(prev_output_tokens).clone()
        rows[:, : seen.shape[1]] = seen
        return rows

    def forward(self, prev_output_tokens, *args, features_only=False, **kwargs):
        x, extra = super().forward(prev_output_tokens, *args, features_only=True, **kwargs)
        if features_only:
            return x, extra
        rows = self.prior_rows(prev_output_tokens)[:, -x.shape[1] :]  # incremental: the last
        extra[ROWS_KEY] = rows
        return self.output_projection(x, rows), extra


def attach_language_prior(decoder, language_tokens: list) -> None:
    """Give ``decoder`` (built a :class:`LanguagePriorDecoder`) the row
    selection: the k-th token selects row k."""
    if not isinstance(decoder, LanguagePriorDecoder):
        raise NaturalBiasError(
            f"--natbias-prior per-language supports fairseq's transformer decoder, not "
            f"{type(decoder).__name__}: use --natbias-prior pooled"
        )
    token_rows = torch.zeros(decoder.output_projection.out_features, dtype=torch.long)
    token_rows[torch.tensor(language_tokens)] = torch.arange(1, len(language_tokens) + 1)
    decoder.register_buffer("token_rows", token_rows, persistent=False)


def language_rows(task, args) -> list:
    """The token of each target language that selects its row (row k for the
    k-th): ``per-language`` (the default) where the decoder is told the
    language, else one pooled prior (refused where asked for explicitly).
    One target language has a row too: its words, not row 0's language token."""
    if args.natbias_prior != "per-language":
        return []
    tokens = (
        training_data.target_language_tokens(task) if training_data.is_multilingual(task) else {}
    )
    if list(tokens.values()) == [None]:  # one language, never told: the pooled prior is its own
        return []
    obstacle = _per_language_obstacle(task, tokens, args)
    if obstacle is None:
        return list(tokens.values())
    if "natbias_prior" in args.natbias_defaulted:  # the default where it applies: pooled here
        return []
    raise NaturalBiasError(f"--natbias-prior per-language: {obstacle}; or --natbias-prior pooled")


def _per_language_obstacle(task, tokens: dict, args):
    """Why the model cannot have a row per target language, or None."""
    if not tokens:
        return f"it needs a multilingual task (translation_multi_simple_epoch), not {type(task).__name__}"
    if None in tokens.values():
        return f"the decoder is not told which of {sorted(tokens)} to write: add --decoder-langtok"
    if args.natbias_order == 2 or args.natbias_init in ("file", "none"):
        return "--natbias-order 2, --natbias-init file and none have no row per language"


def language_symbols(task) -> list:
    """The language tokens the task adds to the dictionaries it reads (a counts
    file made from ``dict.LANG.txt`` lacks them)."""
    if not training_data.is_multilingual(task):
        return []
    from fairseq.data.multilingual.multilingual_utils import get_lang_tok

    return [get_lang_tok(lang, task.args.lang_tok_style) for lang in task.langs]
