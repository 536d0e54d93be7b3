"""``transformer_natbias``: fairseq's transformer with a natural output bias.

Meister et al. (2023), sec. 2.2: the final layer's bias b, with

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)     (4)

starts as the log-unigram distribution of the target training data, so that
p_b is the unigram and the contextual part ``W phi`` is left to model the rest.

Bias modes (``--natbias-init``):

``unigram``  log p(v) of the smoothed target-side unigram of the training data
``zero``     b = 0 (the paper's baseline 0)
``none``     no bias (the paper's other baseline; fairseq's own default)
``file``     log-unigram of a counts file (``--natbias-counts``, App. A.7)

Counting happens once, when a model is built for training from scratch. A model
built to load a checkpoint (``fairseq-generate``, ``fairseq-interactive``,
resuming, ``--finetune-from-model``) gets placeholders that the checkpoint
overwrites, so it neither recounts nor needs the training data.
"""

import logging
import os

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerModel, base_architecture

from fairseq_natbias import unigram
from fairseq_natbias.logging_hook import TARGET_MASK_KEY, BiasDivergenceHook
from fairseq_natbias.output_projection import (
    DEFAULT_WEIGHT_INIT,
    WEIGHT_INITS,
    attach_output_bias,
    init_output_weights,
)

logger = logging.getLogger(__name__)

BIAS_INITS = ("unigram", "zero", "none", "file")

# Recorded in the model's saved config once the bias has been initialised from
# counts; a model built from that config is being loaded, not trained afresh.
COUNTED_MARKER = "natbias_target_tokens"


@register_model("transformer_natbias")
class TransformerNatbiasModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        group = parser.add_argument_group("natural bias (fairseq_natbias)")
        group.add_argument("--natbias-init", choices=BIAS_INITS,
                           help="output bias init: unigram (default), zero, none, file")
        group.add_argument("--natbias-counts", metavar="PATH",
                           help="counts file for --natbias-init file "
                                "(make one with natbias-count)")
        group.add_argument("--natbias-smoothing", type=float, metavar="ALPHA",
                           help="add-alpha smoothing of the unigram counts (default 1.0)")
        group.add_argument("--natbias-freeze", action="store_true",
                           help="hold the output bias fixed during training")
        group.add_argument("--natbias-weight-init", choices=WEIGHT_INITS,
                           help="output-layer weight init: fairseq (default: "
                                "fairseq's own), damped, paper; see the README's "
                                "learning-efficiency study for why")
        group.add_argument("--natbias-feature-gain", type=float, metavar="G",
                           help="initial gain of the norm producing phi with "
                                "--natbias-weight-init damped (default 0.1)")
        group.add_argument("--no-natbias-logging", action="store_true",
                           help="do not log bias_kl, bias_norm, kl_unigram, kl_uniform")
        group.add_argument("--natbias-stats-interval", type=int, metavar="N",
                           help="compute kl_unigram/kl_uniform every N training "
                                "updates (default: --log-interval)")

    @classmethod
    def build_model(cls, args, task):
        natbias_base_architecture(args)
        try:
            _check_args(args)
            model = super().build_model(args, task)
            cls._init_natbias(model, args, task)
        except (unigram.UnigramError, ValueError) as error:
            # A clear one-line message from fairseq-train, not a traceback.
            raise SystemExit(f"fairseq_natbias: error: {error}") from error
        return model

    @classmethod
    def _init_natbias(cls, model, args, task):
        vocab_size = len(task.target_dictionary)
        if _weights_will_be_loaded(args):  # placeholders the checkpoint overwrites
            log_unigram = torch.zeros(vocab_size)
            bias = None if args.natbias_init == "none" else torch.zeros(vocab_size)
        else:
            log_unigram, bias = _count_and_initialise(model, args, task)
        attach_output_bias(model.decoder, bias, freeze=args.natbias_freeze)
        model.register_buffer("target_log_unigram", log_unigram)
        model.natbias_hook = None
        if not args.no_natbias_logging:
            interval = args.natbias_stats_interval or getattr(args, "log_interval", 100)
            model.natbias_hook = BiasDivergenceHook(model, interval)
            model.natbias_hook.attach(task)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        net_output = super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and hook.armed:
            # prev_output_tokens is the target shifted right: same padding.
            net_output[1][TARGET_MASK_KEY] = prev_output_tokens.ne(
                self.decoder.padding_idx
            )
        return net_output

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        net_output = self._controlled_logits(net_output)
        probs = super().get_normalized_probs(net_output, log_probs, sample)
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and log_probs:
            hook.observe(probs, net_output)
        return probs


    def _controlled_logits(self, net_output):
        """Generation-time control of the frequency bias (set only through
        ``fairseq-generate --model-overrides``; see fairseq_natbias/analysis/sweep.py):
        logits ``W phi + b`` become ``W phi + lambda b - tau log unigram``.

        Refused in training mode: fairseq-train has no such options, and a
        model trained with them would save them in its checkpoint."""
        scale = getattr(self.args, "natbias_bias_scale", None)
        adjust = getattr(self.args, "natbias_logit_adjustment", None)
        scale = 1.0 if scale is None else float(scale)
        adjust = 0.0 if adjust is None else float(adjust)
        if scale == 1.0 and adjust == 0.0:
            return net_output
        if self.training:
            raise ValueError(
                f"natbias_bias_scale={scale:g} / natbias_logit_adjustment={adjust:g} "
                "are generation-time settings (fairseq-generate --model-overrides); "
                "they are refused in training, where a saved checkpoint would keep them"
            )
        logits = net_output[0]
        bias = self.decoder.output_projection.bias
        if bias is not None and scale != 1.0:
            logits = logits + (scale - 1.0) * bias.to(logits.dtype)
        if adjust != 0.0:
            logits = logits - adjust * self.target_log_unigram.to(logits.dtype)
        return (logits, *net_output[1:])


def _check_args(args):
    if getattr(args, "adaptive_softmax_cutoff", None):
        raise ValueError(
            "transformer_natbias does not support --adaptive-softmax-cutoff: the "
            "natural bias is one vector over the whole target vocabulary, which "
            "an adaptive softmax splits into clusters. Drop the option."
        )
    unigram.check_smoothing(args.natbias_smoothing)
    if args.natbias_init == "file" and not args.natbias_counts:
        raise ValueError(
            "--natbias-init file needs --natbias-counts PATH (a counts file made "
            "with `natbias-count --dict DATA/dict.TGT.txt --text CORPUS.tok`)"
        )
    if args.natbias_counts and args.natbias_init != "file":
        raise ValueError(
            f"--natbias-counts is only read with --natbias-init file, not "
            f"--natbias-init {args.natbias_init}"
        )


def _count_and_initialise(model, args, task):
    """Count the target training unigram, initialise W, and return the
    log-unigram and the initial bias (None for ``none``)."""
    counts = unigram.count_target_tokens(
        task.cfg.data, getattr(args, "train_subset", "train"),
        task.cfg.source_lang, task.cfg.target_lang, len(task.target_dictionary),
    )
    log_unigram = unigram.unigram_log_probs(counts, args.natbias_smoothing)
    bias = _initial_bias(args, task, log_unigram)
    # W's reference norm is the log-unigram's also for zero / none, so that the
    # three runs share W and differ in the bias alone.
    reference = log_unigram if bias is None or args.natbias_init == "zero" else bias
    init_output_weights(model.decoder, args.natbias_weight_init,
                        reference.norm().item(), args.natbias_feature_gain)
    setattr(args, COUNTED_MARKER, int(counts.sum()))
    return log_unigram, bias


def _initial_bias(args, task, log_unigram):
    if args.natbias_init == "unigram":
        return log_unigram.clone()
    if args.natbias_init == "zero":
        return torch.zeros_like(log_unigram)
    if args.natbias_init == "file":
        counts = unigram.read_counts_file(args.natbias_counts, task.target_dictionary)
        return unigram.unigram_log_probs(counts, args.natbias_smoothing)
    return None


def _weights_will_be_loaded(args) -> bool:
    """True when the parameters built here are about to be overwritten from a
    checkpoint: the config came from a checkpoint (generation), or training
    resumes / fine-tunes from one (fairseq's own restore rules)."""
    if getattr(args, COUNTED_MARKER, None) is not None:
        return True
    save_dir = getattr(args, "save_dir", "checkpoints")
    restore_file = getattr(args, "restore_file", "checkpoint_last.pt")
    suffix = getattr(args, "checkpoint_suffix", "") or ""
    if restore_file == "checkpoint_last.pt":
        last = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        if os.path.exists(last):
            return True
        finetune = getattr(args, "finetune_from_model", None)
        return bool(finetune) and os.path.exists(finetune)
    return os.path.exists(restore_file)


# --- architectures -------------------------------------------------------------


def _natbias_defaults(args):
    args.natbias_init = getattr(args, "natbias_init", None) or "unigram"
    args.natbias_counts = getattr(args, "natbias_counts", None)
    smoothing = getattr(args, "natbias_smoothing", None)
    args.natbias_smoothing = 1.0 if smoothing is None else smoothing
    args.natbias_freeze = getattr(args, "natbias_freeze", False)
    args.natbias_weight_init = getattr(args, "natbias_weight_init", None) or DEFAULT_WEIGHT_INIT
    gain = getattr(args, "natbias_feature_gain", None)
    args.natbias_feature_gain = 0.1 if gain is None else gain
    args.no_natbias_logging = getattr(args, "no_natbias_logging", False)
    args.natbias_stats_interval = getattr(args, "natbias_stats_interval", None)


@register_model_architecture("transformer_natbias", "transformer_natbias")
def natbias_base_architecture(args):
    """Transformer base (Vaswani et al., 2017): d=512, FFN 2048, 8 heads, 6+6."""
    _natbias_defaults(args)
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
