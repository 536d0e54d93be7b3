"""The natural bias on a fairseq decoder (Meister et al., 2023, sec. 2.2:

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)     (4)

with b starting as the target log-unigram), what ``transformer_natbias`` and
``transformer_lm_natbias`` share: the decoder's output projection replaced
once, by :class:`natbias.projection.NaturalBiasProjection` around its own
weight (tied embeddings stay tied), b counted once, for training from scratch
(:mod:`fairseq_natbias.training_data`); a model built to load a checkpoint gets
placeholders that it overwrites (:mod:`fairseq_natbias.checkpoints`).
"""

import logging
from typing import Optional

import torch
from fairseq.models.transformer import TransformerDecoderBase

from fairseq_natbias import bigram_residual, language_prior, task_hooks, training_data
from fairseq_natbias.checkpoint_loading import CheckpointError, not_a_checkpoint
from fairseq_natbias.checkpoints import (
    check_saved_settings,
    checkpoint_to_load,
    reconcile_with_checkpoint,
    saved_model_args,
)
from fairseq_natbias.logging_hook import TARGET_MASK_KEY, BiasDivergenceHook
from fairseq_natbias.options import COUNTED_MARKER, DEFAULTED_RECORD, LANGUAGE_TOKENS, check_args
from natbias import head
from natbias.bigram import PairCounter, witten_bell_residual
from natbias.counts import count_text, read_counts_file
from natbias.errors import NaturalBiasError
from natbias.head_config import HeadConfig
from natbias.prior import log_unigram
from natbias.projection import KeepsFloat32, paper_weight_init_

logger = logging.getLogger(__name__)

# Generation-time settings, given as --model-overrides keys (docs/options.md).
BIAS_SCALE = "natbias_bias_scale"  # lambda: logits g W phi + lambda b
LOGIT_ADJUSTMENT = "natbias_logit_adjustment"  # tau: minus tau log-unigram
PRIOR_TEXT = "natbias_prior_text"  # PATH: the prior of another corpus


class NaturalBiasModel(KeepsFloat32):
    """Mixin for a fairseq model with a ``decoder``, inherited before the
    fairseq base class; the model's ``forward`` ends with :meth:`_mark_targets`."""

    # bfloat16 would round a rare token's log-probability (-17 nats) to the nearest 0.125.
    float32_buffers = ("target_log_unigram",)
    splitting_options = ("adaptive_softmax_cutoff",)  # refused: the bias is one vector

    @classmethod
    def build_model(cls, args, task, config: Optional[HeadConfig] = None):
        """fairseq's; ``config``: the head's settings in place of their options."""
        # The options' defaults are set by the registered architecture, which
        # fairseq applies before it builds (options.set_defaults).
        if config is not None:
            use_head_config(args, config)
        loading = checkpoint_to_load(args)
        if loading is not None and loading[0] == "config":
            check_saved_settings(args, "this checkpoint")
        check_args(args, cls.splitting_options)
        if loading is not None and loading[0] != "config":
            reconcile_with_checkpoint(args, *loading)
        if loading is None:  # which tokens select a per-language row (none: one prior)
            setattr(args, LANGUAGE_TOKENS, language_prior.language_rows(task, args))
        per_language = bool(getattr(args, LANGUAGE_TOKENS, None))
        args.natbias_prior = "per-language" if per_language else "pooled"  # as built
        model = super().build_model(args, task)
        model._init_natbias(args, task, weights_will_be_loaded=loading is not None)
        return model

    def _init_natbias(self, args, task, weights_will_be_loaded: bool) -> None:
        decoder = self.decoder
        vocab_size = decoder.output_projection.out_features
        language_tokens = getattr(args, LANGUAGE_TOKENS, None) or []
        residual = None
        if weights_will_be_loaded:  # placeholders the checkpoint overwrites
            shape = (1 + len(language_tokens), vocab_size) if language_tokens else (vocab_size,)
            log_prior = torch.zeros(shape)
            bias = None if args.natbias_init == "none" else torch.zeros(shape)
            if args.natbias_order == 2:
                residual = bigram_residual.BigramResidual.placeholder(vocab_size)
        else:
            log_prior, bias, residual = self._count_and_initialise(args, task)
        gain = args.natbias_weight_init == "gain"  # the options set every setting (set_defaults)
        config = HeadConfig(
            args.natbias_smoothing, gain, args.natbias_gain_init, args.natbias_gain_speed
        )
        decoder.output_projection = config.projection(decoder.output_projection.weight, bias)
        if bias is not None and args.natbias_freeze:
            decoder.output_projection.bias.requires_grad_(False)
        if residual is not None:
            bigram_residual.attach_bigram_residual(decoder, residual)
        if language_tokens:
            language_prior.attach_language_prior(decoder, language_tokens)
        self.register_buffer("target_log_unigram", log_prior)
        self.natbias_args = args  # read by the generation-time settings
        self.natbias_hook = None
        if not args.no_natbias_logging:
            interval = args.natbias_stats_interval or getattr(args, "log_interval", 100)
            self.natbias_hook = BiasDivergenceHook(self, interval)
            task_hooks.attach(task, hook=self.natbias_hook)

    def _count_and_initialise(self, args, task):
        """Count the training targets (and their bigrams, order 2, in the same
        pass; each target language's, per-language); returns the log prior,
        the initial bias (None for ``none``) and the bigram residual (None for
        order 1). ``file``: the file's prior, nothing counted from the task
        (App. A.7). W's init: ``paper`` rescales W to the norm of the (pooled)
        log prior also for ``zero`` and ``none``, so the three runs differ in
        the bias alone."""
        dictionary, smoothing = task.target_dictionary, args.natbias_smoothing
        split = getattr(args, "train_subset", "train")
        pairs = PairCounter(len(dictionary), dictionary.eos()) if args.natbias_order == 2 else None
        residual = None
        if args.natbias_init == "file":
            added = language_prior.language_symbols(task)  # a multilingual task's language tokens
            counts = read_counts_file(args.natbias_counts, training_data.symbols(dictionary), added)
            counts = training_data.language_tokens_as_fed(task, counts)
            log_prior = log_unigram(counts, smoothing)
        elif getattr(args, LANGUAGE_TOKENS, None):  # row 0 pooled, then each target language
            counts, by_language = training_data.count_multilingual_targets(task, split)
            log_prior = torch.stack(
                [log_unigram(c, smoothing) for c in (counts, *by_language.values())]
            )
        else:
            counts = training_data.count_training_targets(task, split, pairs)
            log_prior = log_unigram(counts, smoothing)
        bias = None if args.natbias_init == "none" else log_prior.clone()
        if args.natbias_init == "zero":
            bias.zero_()
        if pairs is not None:
            table = pairs.table()
            residual = bigram_residual.BigramResidual(
                *witten_bell_residual(table, log_prior), counts=torch.from_numpy(table.counts)
            )
        if args.natbias_weight_init == "paper":
            reference = head.pooled_row(log_prior).norm().item()
            paper_weight_init_(self.decoder.output_projection.weight, reference)
        setattr(args, COUNTED_MARKER, int(counts.sum()))
        return log_prior, bias, residual

    def _float32_device(self) -> torch.device:
        return next(self.parameters()).device

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's, then the prior swapped when the model is loaded with
        ``natbias_prior_text`` (:meth:`swap_prior`)."""
        loaded = super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)
        prior_text = getattr(self.natbias_args, PRIOR_TEXT, None)
        if prior_text:
            self.swap_prior(prior_text)
        return loaded

    def swap_prior(self, text_path: str) -> None:
        """Replace the statistical prior by that of another corpus (the
        paper's App. A.7; Li et al.'s domain adaptation): tokenised text, the
        model's pieces, one sentence a line. With p the training unigram and q
        the text's, the bias keeps what training added to log p::

            b' = b - log p + log q     (order 2: the bigram table becomes the text's)
        """
        if head.per_language(self.target_log_unigram):
            raise NaturalBiasError(
                f"{PRIOR_TEXT} swaps one prior; this model has one per target language"
            )
        dictionary = self.decoder.dictionary
        order_2 = self.natbias_args.natbias_order == 2
        pairs = PairCounter(len(dictionary), dictionary.eos()) if order_2 else None
        fix = "give a tokenised text file (the model's pieces, one sentence a line)"
        try:
            with open(text_path, encoding="utf-8") as lines:
                counts = count_text(
                    lines, dictionary.index, dictionary.eos(), len(dictionary), pairs
                )
        except OSError as error:
            raise NaturalBiasError(f"{PRIOR_TEXT} {text_path}: {error.strerror}; {fix}") from None
        except UnicodeDecodeError as error:
            raise NaturalBiasError(
                f"{PRIOR_TEXT} {text_path} is not UTF-8 text (byte {error.start}); {fix}"
            ) from None
        if counts.sum() == counts[dictionary.eos()]:
            raise NaturalBiasError(f"{PRIOR_TEXT} {text_path} holds no tokens; {fix}")
        new_prior = log_unigram(counts, self.natbias_args.natbias_smoothing).to(
            self.target_log_unigram.device
        )
        with torch.no_grad():
            bias = self.decoder.output_projection.bias
            if bias is not None:
                bias.add_(new_prior - self.target_log_unigram)
            self.target_log_unigram.copy_(new_prior)
            if pairs is not None:
                table = witten_bell_residual(pairs.table(), new_prior)
                bigram_residual.bigram_residual(self.decoder).replace_table(*table)
        logger.info(
            "natbias: prior swapped for the counts of %s (%d tokens)", text_path, int(counts.sum())
        )

    def _mark_targets(self, net_output, target_tokens):
        """Tell the logging hook which positions are real targets: those where
        ``target_tokens`` (aligned with the targets, padded alike) is not pad."""
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and hook.armed:
            net_output[1][TARGET_MASK_KEY] = target_tokens.ne(self.decoder.padding_idx)
        return net_output

    def get_normalized_probs(self, net_output, log_probs, sample=None):
        probs = super().get_normalized_probs(self._controlled_logits(net_output), log_probs, sample)
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and log_probs:
            hook.observe(probs, net_output)
        return probs

    def _controlled_logits(self, net_output):
        """Generation-time control of the frequency prior: logits ``g W phi +
        b`` become ``g W phi + lambda b - tau log unigram`` (Kobayashi et al.,
        2023: lambda; logit adjustment: tau). Refused in training, where a
        saved checkpoint would keep them."""
        scale = getattr(self.natbias_args, BIAS_SCALE, None)
        adjust = getattr(self.natbias_args, LOGIT_ADJUSTMENT, None)
        scale = 1.0 if scale is None else float(scale)
        adjust = 0.0 if adjust is None else float(adjust)
        if scale == 1.0 and adjust == 0.0:
            return net_output
        if self.training:
            raise NaturalBiasError(
                f"{BIAS_SCALE}={scale:g} / {LOGIT_ADJUSTMENT}={adjust:g} are "
                "generation-time settings (--model-overrides), refused in training"
            )
        rows = net_output[1].get(language_prior.ROWS_KEY)  # per-language: each position's row
        bias = self.decoder.output_projection.bias
        shift = head.generation_shift(
            None if bias is None else head.bias_rows(bias, rows),
            scale,
            head.bias_rows(self.target_log_unigram, rows),
            adjust,
        )
        if shift is None:  # lambda on a model without b
            return net_output
        logits = net_output[0]
        return (logits + shift.to(logits.dtype), *net_output[1:])


def decoder_class(cfg) -> type:
    """The translation decoder's class: one that adds each position's row of
    the bias, one with the bigram residual, else fairseq's."""
    if getattr(cfg, LANGUAGE_TOKENS, None):
        return language_prior.LanguagePriorDecoder
    if getattr(cfg, "natbias_order", 1) == 2:
        return bigram_residual.TransformerDecoderBaseWithBigram
    return TransformerDecoderBase


HEAD_OPTIONS = {"smoothing": "natbias_smoothing", "gain": "natbias_weight_init",
                "gain_init": "natbias_gain_init", "gain_speed": "natbias_gain_speed"}  # fmt: skip


def use_head_config(args, config: HeadConfig) -> None:
    """``config`` written into the options (which a checkpoint saves); an
    option set on the command line that differs from it is refused."""
    defaulted = getattr(args, DEFAULTED_RECORD)
    given = {k: getattr(args, o) for k, o in HEAD_OPTIONS.items() if o not in defaulted}
    if "gain" in given:  # --natbias-weight-init gain, or another W init without the gain
        given["gain"] = given["gain"] == "gain"
    HeadConfig.of(config, **given)
    args.natbias_smoothing = config.smoothing
    if config.gain:
        args.natbias_weight_init = "gain"
        args.natbias_gain_init, args.natbias_gain_speed = config.gain_settings()
    elif args.natbias_weight_init == "gain":
        args.natbias_weight_init = "fairseq"


def check_natbias_checkpoint(path: str):
    """``(arch, model class)`` of a checkpoint of a fairseq_natbias model; a
    CheckpointError naming the fix for anything else."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    saved = saved_model_args(path)
    if saved is None:
        raise not_a_checkpoint(path, "it holds no training configuration")
    arch = getattr(saved, "arch", None)
    model_class: Optional[type] = ARCH_MODEL_REGISTRY.get(arch)
    if model_class is None or not issubclass(model_class, NaturalBiasModel):
        raise CheckpointError(
            f"{path} was trained with --arch {arch}, not a fairseq_natbias "
            "model: give a checkpoint trained with --user-dir fairseq_natbias "
            "--arch transformer_natbias (or transformer_lm_natbias)"
        )
    return arch, model_class
