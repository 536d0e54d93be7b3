"""The statistics of :mod:`natbias.statistics` (App. A.6) on fairseq's own ``train_inner``,
``train`` and ``valid`` lines (docs/options.md#the-training-log): the
divergences travel in the logging outputs as sums with a token count, so
fairseq's reduction over micro-batches and workers weights every token once.
The hook wraps the task the model is built for
(:mod:`fairseq_natbias.task_hooks`), which is what makes it work with any
criterion.
"""

import logging

from fairseq.logging import metrics

from fairseq_natbias.language_prior import ROWS_KEY as PRIOR_ROWS_KEY
from natbias.statistics import CHUNK_ELEMENTS, LN2, bias_statistics, divergence_sums

logger = logging.getLogger(__name__)

TARGET_MASK_KEY = "natbias_target_mask"
SUM_KEYS = ("natbias_kl_unigram", "natbias_kl_uniform", "natbias_tokens")
# What this hook logs (a meter fairseq would print as None is dropped).
LOGGED_KEYS = "kl_unigram kl_uniform gain weight_norm bias_norm bias_kl bigram_weight".split()


class BiasDivergenceHook:
    def __init__(self, model, stats_interval: int):
        self.model = model
        self.stats_interval = max(1, int(stats_interval))
        self.armed = False
        self.chunk_elements = CHUNK_ELEMENTS  # float32 entries per temporary
        self._log_bias_now = False
        self._sums = dict.fromkeys(SUM_KEYS, 0.0)
        if model.decoder.output_projection.bias is None:
            logger.info(
                "natbias: this model has no output bias (--natbias-init none); "
                "logging kl_unigram, kl_uniform and weight_norm only"
            )

    def around_step(self, step, update_num):
        """``step()``, a training step (its ``update_num``) or a validation
        step (None), observed if due, with this hook's sums in its logging output."""
        self.armed = update_num is None or (update_num + 1) % self.stats_interval == 0
        self._log_bias_now = self._log_bias_now or self.armed
        try:
            loss, sample_size, logging_output = step()
        finally:
            self.armed = False
        # The same keys on every worker: fairseq's fast all-reduce stacks them key by key.
        logging_output.update(self._sums)
        self._sums = dict.fromkeys(SUM_KEYS, 0.0)
        return loss, sample_size, logging_output

    def observe(self, lprobs, net_output) -> None:
        """Accumulate the per-token divergences of one forward pass (called by
        the model's ``get_normalized_probs``; once per ``net_output``)."""
        extra = net_output[1] if len(net_output) > 1 else None
        if not self.armed or not isinstance(extra, dict):
            return
        mask = extra.pop(TARGET_MASK_KEY, None)  # pop: count each output once
        if mask is None:
            return
        prior, rows = self.model.target_log_unigram, extra.get(PRIOR_ROWS_KEY)
        sums = divergence_sums(lprobs, mask, prior, self.chunk_elements, rows)
        for key, value in zip(SUM_KEYS, sums):
            self._sums[key] = self._sums[key] + value

    def bias_statistics(self) -> dict:
        decoder = self.model.decoder
        projection = decoder.output_projection
        stats = bias_statistics(
            projection.bias, self.model.target_log_unigram, projection.weight, projection.gain()
        )
        residual = getattr(decoder, "bigram_residual", None)
        if residual is not None:
            stats["bigram_weight"] = residual.weight.detach().float().item()
        return stats

    def log(self, logging_outputs) -> None:
        _drop_empty_meters()
        tokens = float(sum(log.get("natbias_tokens", 0.0) for log in logging_outputs))
        if tokens > 0:
            for key in ("kl_unigram", "kl_uniform"):
                total = float(sum(log.get("natbias_" + key, 0.0) for log in logging_outputs))
                metrics.log_scalar(key, total / tokens / LN2, tokens, round=3)
        if self._log_bias_now:
            self._log_bias_now = False
            for key, value in self.bias_statistics().items():
                metrics.log_scalar(key, value, 1, round=4)


def _drop_empty_meters() -> None:
    """Remove this hook's meters that hold no value: fairseq resets an epoch's
    meters but keeps them, so an epoch (or a log interval) without a
    statistics update would print ``kl_unigram None``. A dropped meter comes
    back with the next value. fairseq 0.12's MetersDict keeps the order of
    its keys in ``priorities`` as well."""
    for name in ("train", "train_inner"):
        meters = metrics.get_meters(name)
        if not meters:
            continue
        for key in LOGGED_KEYS:
            if key in meters and getattr(meters[key], "count", 1) == 0:
                del meters[key]
                meters.priorities = [p for p in meters.priorities if p[2] != key]
