"""The natural bias on a fairseq decoder: what ``transformer_natbias`` and
``transformer_lm_natbias`` share.

Meister et al. (2023), sec. 2.2: the final layer's bias b, with

    p_theta(y | y_<t) ∝ p_Wphi(y | y_<t) * p_b(y),    p_b = softmax(b)     (4)

starts as the log-unigram distribution of the target training data, so that
p_b is the unigram and the contextual part ``W phi`` is left to model the rest.

Bias modes (``--natbias-init``):

``unigram``  log p(v) of the smoothed target-side unigram of the training data
``zero``     b = 0 (the paper's baseline 0)
``none``     no bias (the paper's other baseline; fairseq's own default)
``file``     log-unigram of a counts file (``--natbias-counts``, App. A.7)

Weight inits (``--natbias-weight-init``): see :mod:`fairseq_natbias.output_projection`.

Counting happens once, when a model is built for training from scratch. A model
built to load a checkpoint (``fairseq-generate``, ``fairseq-eval-lm``,
resuming, ``--finetune-from-model``) gets placeholders that the checkpoint
overwrites, so it neither recounts nor needs the training data. Its natural-bias
settings are then the checkpoint's: see
:func:`fairseq_natbias.checkpoint_settings.reconcile_with_checkpoint`.

A model class uses this module by inheriting :class:`NaturalBiasModel` before
its fairseq base class; what is counted follows the task
(:func:`fairseq_natbias.unigram.count_training_targets`).
:func:`check_natbias_checkpoint` tells a checkpoint of such a model from others.

Where the rest is:

``natural_bias_options``     the ``--natbias-*`` options, defaults and checks
``checkpoint_settings``      a checkpoint's settings for a model that loads it
``checkpoint_loading``       reading a checkpoint file (below all of these)
``output_projection``        the bias, the gain and the weight inits of W
``unigram``                  counting the target unigram
``logging_hook``             the bias-divergence statistics logged in training
"""

import logging
from typing import Optional

import torch

from fairseq_natbias import bigram, bigram_residual, output_projection, unigram
from fairseq_natbias.checkpoint_loading import CheckpointError, not_a_checkpoint, saved_model_args
from fairseq_natbias.checkpoint_settings import checkpoint_to_load, reconcile_with_checkpoint
from fairseq_natbias.logging_hook import TARGET_MASK_KEY, BiasDivergenceHook
from fairseq_natbias.natural_bias_options import (
    COUNTED_MARKER, check_args, check_new_model, set_defaults,
)

logger = logging.getLogger(__name__)

# The generation-time override that swaps the prior for another corpus's.
PRIOR_TEXT = "natbias_prior_text"


class NaturalBiasModel:
    """Mixin for a fairseq model with a ``decoder`` whose output projection
    gets the natural bias. The model class inherits it before its fairseq base
    and calls :meth:`_mark_targets` at the end of its ``forward``."""

    @classmethod
    def build_model(cls, args, task):
        set_defaults(args)
        try:
            check_args(args)
            loading = checkpoint_to_load(args)
            if loading is None:
                check_new_model(args)
            elif loading[0] != "config":
                reconcile_with_checkpoint(args, *loading)
            model = super().build_model(args, task)
            model._init_natbias(args, task, loading is not None)
        except (unigram.UnigramError, ValueError) as error:
            # A clear one-line message from fairseq-train, not a traceback.
            raise SystemExit(f"fairseq_natbias: error: {error}") from error
        return model

    def _init_natbias(self, args, task, weights_will_be_loaded: bool) -> None:
        decoder = self.decoder
        vocab_size = decoder.output_projection.out_features
        if weights_will_be_loaded:  # placeholders the checkpoint overwrites
            log_unigram = torch.zeros(vocab_size)
            bias = None if args.natbias_init == "none" else torch.zeros(vocab_size)
            residual = (bigram_residual.BigramResidual.placeholder(vocab_size)
                        if args.natbias_order == 2 else None)
        else:
            log_unigram, bias, residual = self._count_and_initialise(args, task)
        output_projection.attach_output_bias(decoder, bias, freeze=args.natbias_freeze)
        if args.natbias_order == 2:
            bigram_residual.attach_bigram_residual(decoder, residual)
        if args.natbias_weight_init == "gain":
            output_projection.add_output_gain(
                decoder, args.natbias_gain_init, args.natbias_gain_speed, args.natbias_gain_form,
                args.natbias_gain_schedule, output_projection.WarmupSpeedup.from_args(args))
        self.register_buffer("target_log_unigram", log_unigram)
        self.natbias_args = args  # read by _controlled_logits (--model-overrides)
        self.natbias_hook = None
        if not args.no_natbias_logging:
            interval = args.natbias_stats_interval or getattr(args, "log_interval", 100)
            self.natbias_hook = BiasDivergenceHook(self, interval)
            self.natbias_hook.attach(task)

    def _count_and_initialise(self, args, task):
        """Count the target training unigram (and bigram, order 2, in the same
        pass), initialise W, and return the log-unigram, the initial bias (None
        for ``none``) and the bigram residual (None for order 1)."""
        dictionary = task.target_dictionary
        pairs = (bigram.PairCounter(len(dictionary), dictionary.eos())
                 if args.natbias_order == 2 else None)
        counts = unigram.count_training_targets(task, getattr(args, "train_subset", "train"),
                                                pairs)
        log_unigram = unigram.unigram_log_probs(counts, args.natbias_smoothing)
        residual = None
        if pairs is not None:
            table = pairs.table()
            residual = bigram_residual.BigramResidual(
                *bigram.witten_bell_residual(table, log_unigram),
                counts=torch.from_numpy(table.counts))
        bias = _initial_bias(args, task, log_unigram)
        # W's reference norm is the log-unigram's also for zero / none, so that
        # the three runs share W and differ in the bias alone.
        reference = log_unigram if bias is None or args.natbias_init == "zero" else bias
        output_projection.init_output_weights(
            self.decoder, args.natbias_weight_init, reference.norm().item())
        setattr(args, COUNTED_MARKER, int(counts.sum()))
        return log_unigram, bias, residual

    def _apply(self, fn, *args, **kwargs):
        """Keep ``target_log_unigram`` in float32 whatever the model is cast to
        (fairseq's --fp16 calls ``.half()``, --bf16 ``.to(torch.bfloat16)``): it
        is a statistic read by the logging hook, the logit adjustment and the
        analysis tools, and bfloat16 would round the log-probability of a rare
        token (~ -17 nats) to the nearest 0.125. The bias and the gain
        parameter stay float32 too (:class:`output_projection.OutputProjection`)."""
        # Taken out while fn casts the rest, then moved to the parameters'
        # device only: casting it to half and back would lose the precision.
        log_unigram = self._buffers.pop("target_log_unigram", None)
        try:
            module = super()._apply(fn, *args, **kwargs)
        finally:
            if log_unigram is not None:
                device = next(self.parameters()).device
                self._buffers["target_log_unigram"] = log_unigram.to(device, torch.float32)
        return module

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's, then the prior swapped for another corpus's when the
        model is loaded with ``natbias_prior_text`` (:meth:`swap_prior`)."""
        loaded = super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                         args=args)
        prior_text = getattr(self.natbias_args, PRIOR_TEXT, None)
        if prior_text:
            self.swap_prior(prior_text)
        return loaded

    def swap_prior(self, text_path: str) -> None:
        """Replace the statistical prior by that of another corpus (Li et al.'s
        domain adaptation; the paper's App. A.7 unigram of a larger corpus),
        set at generation with ``--model-overrides "{'natbias_prior_text':
        PATH}"``. PATH: tokenised text as the model's pieces, one sentence a
        line. With p the stored training unigram and q the text's (same
        smoothing), the bias keeps what training added to log p:

            b' = b - log p + log q,        D' = the Witten-Bell table of the text (order 2)

        and the stored log-unigram becomes log q (so logit adjustment uses q)."""
        dictionary = self.decoder.dictionary
        order = getattr(self.natbias_args, "natbias_order", 1)
        pairs = bigram.PairCounter(len(dictionary), dictionary.eos()) if order == 2 else None
        try:
            with open(text_path, encoding="utf-8") as lines:
                counts = unigram.count_text(lines, dictionary, pairs)
        except OSError as error:
            raise SystemExit(f"fairseq_natbias: error: {PRIOR_TEXT} {text_path}: {error.strerror}. "
                             "Give a tokenised text file (the model's pieces, one sentence a line).")
        except UnicodeDecodeError as error:
            raise SystemExit(f"fairseq_natbias: error: {PRIOR_TEXT} {text_path} is not UTF-8 text "
                             f"(byte {error.start}). Give a tokenised text file (the model's "
                             "pieces, one sentence a line).") from None
        if counts.sum() == counts[dictionary.eos()]:
            raise SystemExit(f"fairseq_natbias: error: {PRIOR_TEXT} {text_path} holds no tokens")
        new_log_unigram = unigram.unigram_log_probs(counts, self.natbias_args.natbias_smoothing)
        device = self.target_log_unigram.device
        new_log_unigram = new_log_unigram.to(device)
        with torch.no_grad():
            bias = self.decoder.output_projection.bias
            if bias is not None:
                bias.add_(new_log_unigram - self.target_log_unigram)
            self.target_log_unigram.copy_(new_log_unigram)
            if pairs is not None:
                table = bigram.witten_bell_residual(pairs.table(), new_log_unigram)
                bigram_residual.bigram_residual(self.decoder).replace_table(*table)
        logger.info("natbias: prior swapped for the counts of %s (%d tokens%s)", text_path,
                    int(counts.sum()), f", {len(pairs.keys)} bigrams" if pairs is not None else "")

    def _mark_targets(self, net_output, target_tokens):
        """Tell the logging hook which positions are real targets: those where
        ``target_tokens`` (aligned with the targets, padded alike) is not pad."""
        hook = getattr(self, "natbias_hook", None)
        if hook is not None and hook.armed:
            net_output[1][TARGET_MASK_KEY] = target_tokens.ne(self.decoder.padding_idx)
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
        ``--model-overrides``; see fairseq_natbias/analysis/sweep.py):
        logits ``g W phi + b`` become ``g W phi + lambda b - tau log unigram``
        (Kobayashi et al.'s lambda; logit adjustment tau).

        Refused in training mode: fairseq-train has no such options, and a
        model trained with them would save them in its checkpoint."""
        scale = getattr(self.natbias_args, "natbias_bias_scale", None)
        adjust = getattr(self.natbias_args, "natbias_logit_adjustment", None)
        scale = 1.0 if scale is None else float(scale)
        adjust = 0.0 if adjust is None else float(adjust)
        if scale == 1.0 and adjust == 0.0:
            return net_output
        if self.training:
            raise ValueError(
                f"natbias_bias_scale={scale:g} / natbias_logit_adjustment={adjust:g} "
                "are generation-time settings (--model-overrides); they are refused "
                "in training, where a saved checkpoint would keep them"
            )
        logits = net_output[0]
        bias = self.decoder.output_projection.bias
        if bias is not None and scale != 1.0:
            logits = logits + (scale - 1.0) * bias.to(logits.dtype)
        if adjust != 0.0:
            logits = logits - adjust * self.target_log_unigram.to(logits.dtype)
        return (logits, *net_output[1:])


def _initial_bias(args, task, log_unigram) -> Optional[torch.Tensor]:
    if args.natbias_init == "unigram":
        return log_unigram.clone()
    if args.natbias_init == "zero":
        return torch.zeros_like(log_unigram)
    if args.natbias_init == "file":
        counts = unigram.read_counts_file(args.natbias_counts, task.target_dictionary)
        return unigram.unigram_log_probs(counts, args.natbias_smoothing)
    return None


def check_natbias_checkpoint(path: str):
    """``(arch, model class)`` of a checkpoint trained with a fairseq_natbias
    architecture; a CheckpointError, naming the fix, for a missing file, a
    file that is no fairseq checkpoint, or a checkpoint of another model."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    saved = saved_model_args(path)
    if saved is None:
        raise not_a_checkpoint(path, "it holds no training configuration")
    arch = getattr(saved, "arch", None)
    model_class = ARCH_MODEL_REGISTRY.get(arch)
    if model_class is None or not issubclass(model_class, NaturalBiasModel):
        raise CheckpointError(
            f"{path} was trained with --arch {arch}, not a fairseq_natbias model: give a "
            "checkpoint trained with --user-dir fairseq_natbias --arch transformer_natbias "
            "(or transformer_lm_natbias)")
    return arch, model_class
