"""``transformer_lm_natbias``: fairseq's transformer language model with the
natural output bias of Meister et al. (2023), eq. (4):

    p_theta(y_t | y_<t) ∝ p_Wphi(y_t | y_<t) * p_b(y_t),    b = log p_unigram

Trained with ``--task language_modeling`` on ``fairseq-preprocess
--only-source`` data; the bias counts the task's next-token targets
(:mod:`fairseq_natbias.training_data`). Registered the argparse way, like
``transformer_natbias``, so that both share one options group; its
architectures are fairseq's presets, then the dataclass's defaults.
"""

import dataclasses

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture, transformer_lm
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

from fairseq_natbias import natural_bias, options


@register_model("transformer_lm_natbias")
class TransformerLanguageModelNatbias(natural_bias.NaturalBiasModel, TransformerLanguageModel):
    splitting_options = ("adaptive_softmax_cutoff", "adaptive_input", "character_embeddings")

    @classmethod
    def add_args(cls, parser):
        # fairseq's transformer_lm options, left unset so the presets fill them.
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        options.add_args(parser)

    def forward(self, src_tokens, **kwargs):
        net_output = super().forward(src_tokens, **kwargs)
        # The input and the next-token targets are padded alike.
        return self._mark_targets(net_output, src_tokens)


def _dataclass_defaults(args):
    """Fill what a preset left unset with TransformerLanguageModelConfig's own
    defaults (not the ``${task...}`` ones: those options come from the task)."""
    defaults = TransformerLanguageModelConfig()
    for field in dataclasses.fields(defaults):
        default = getattr(defaults, field.name)
        if getattr(args, field.name, None) is None and not str(default).startswith("${"):
            setattr(args, field.name, default)


def _natbias_lm(args, fairseq_preset):
    options.set_defaults(args)
    fairseq_preset(args)
    _dataclass_defaults(args)


@register_model_architecture("transformer_lm_natbias", "transformer_lm_natbias")
def transformer_lm_natbias(args):
    """fairseq's ``transformer_lm``: d 512, FFN 2048, 6 layers, 8 heads, untied."""
    _natbias_lm(args, transformer_lm.base_lm_architecture)


@register_model_architecture("transformer_lm_natbias", "transformer_lm_natbias_gpt")
def transformer_lm_natbias_gpt(args):
    """fairseq's ``transformer_lm_gpt``: d 768, FFN 3072, 12 layers, 12 heads, GELU."""
    _natbias_lm(args, transformer_lm.transformer_lm_gpt)


@register_model_architecture("transformer_lm_natbias", "transformer_lm_natbias_gpt2_small")
def transformer_lm_natbias_gpt2_small(args):
    """fairseq's ``transformer_lm_gpt2_small``: d 1024, FFN 4096, 24 layers, 16 heads."""
    _natbias_lm(args, transformer_lm.transformer_lm_gpt2_small)


@register_model_architecture("transformer_lm_natbias", "transformer_lm_natbias_tiny")
def transformer_lm_natbias_tiny(args):
    """For tests, the demo and the CPU study: d 128, FFN 256, 2 layers,
    4 heads (untied unless --share-decoder-input-output-embed, as fairseq's)."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", None) or 128
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", None) or 256
    args.decoder_layers = getattr(args, "decoder_layers", None) or 2
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", None) or 4
    _natbias_lm(args, transformer_lm.base_lm_architecture)
