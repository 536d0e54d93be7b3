"""``transformer_natbias``: fairseq's transformer (encoder-decoder) with the
natural output bias of Meister et al. (2023), eq. (4):

    p_theta(y | y_<t, x) ∝ p_Wphi(y | y_<t, x) * p_b(y),    b = log p_unigram

The bias and its options are shared with ``transformer_lm_natbias``
(:mod:`fairseq_natbias.natural_bias`); the bias counts the target side of the
binarised training pairs. This module registers the model and the paper's
presets.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel, base_architecture

from fairseq_natbias import natural_bias, options


@register_model("transformer_natbias")
class TransformerNatbiasModel(natural_bias.NaturalBiasModel, TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        options.add_args(parser)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        """fairseq's own, as the subclass the prior needs (a row per target
        language, the bigram residual): its forward sees the input tokens."""
        cfg = TransformerConfig.from_namespace(cfg)
        decoder_class = natural_bias.decoder_class(cfg)
        return decoder_class(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        net_output = super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        # prev_output_tokens is the target shifted right: same padding.
        return self._mark_targets(net_output, prev_output_tokens)


# --- architectures -------------------------------------------------------------


@register_model_architecture("transformer_natbias", "transformer_natbias")
def natbias_base_architecture(args):
    """Transformer base (Vaswani et al., 2017): d=512, FFN 2048, 8 heads, 6+6."""
    options.set_defaults(args)
    base_architecture(args)


def _paper_preset(args, embed_dim, ffn_dim, heads):
    """Sec. 4.1: 6+6 layers, dropout 0.1; the paper does not give d."""
    for side in ("encoder", "decoder"):
        setattr(args, f"{side}_embed_dim", getattr(args, f"{side}_embed_dim", embed_dim))
        setattr(args, f"{side}_ffn_embed_dim", getattr(args, f"{side}_ffn_embed_dim", ffn_dim))
        setattr(args, f"{side}_attention_heads", getattr(args, f"{side}_attention_heads", heads))
        setattr(args, f"{side}_layers", getattr(args, f"{side}_layers", 6))
    args.dropout = getattr(args, "dropout", 0.1)
    natbias_base_architecture(args)


@register_model_architecture("transformer_natbias", "transformer_natbias_iwslt_de_en")
def transformer_natbias_iwslt_de_en(args):
    """IWSLT'14: 4 heads, FFN 256; d=256 (our choice: FFN wider than d
    would need d < 256, fairseq's IWSLT preset uses 512 with FFN 1024)."""
    _paper_preset(args, embed_dim=256, ffn_dim=256, heads=4)


@register_model_architecture("transformer_natbias", "transformer_natbias_wmt_en_de")
def transformer_natbias_wmt_en_de(args):
    """WMT'14: 8 heads, FFN 512; d=512 (fairseq's transformer base width)."""
    _paper_preset(args, embed_dim=512, ffn_dim=512, heads=8)


@register_model_architecture("transformer_natbias", "transformer_natbias_afromt")
def transformer_natbias_afromt(args):
    """AfroMT: 8 heads (use --encoder/decoder-attention-heads 4 for Run-En, as
    the paper does), FFN 256; d=256."""
    _paper_preset(args, embed_dim=256, ffn_dim=256, heads=8)
