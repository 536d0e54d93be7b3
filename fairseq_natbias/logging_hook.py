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
from natbias.metrics import METRICS, per_token
from natbias.statistics import CHUNK_ELEMENTS, Statistics

logger = logging.getLogger(__name__)

TARGET_MASK_KEY = "natbias_target_mask"


class BiasDivergenceHook:
    def __init__(self, model, stats_interval: int):
        self.model = model
        self.stats_interval = max(1, int(stats_interval))
        self.armed = False
        self.chunk_elements = CHUNK_ELEMENTS  # float32 entries per temporary
        self._log_bias_now = False
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
        self._statistics = Statistics(self.chunk_elements)
        try:
            loss, sample_size, logging_output = step()
        finally:
            self.armed = False
        # The same keys on every worker: fairseq's fast all-reduce stacks them key by key.
        sums = self._statistics.sums
        logging_output.update({"natbias_" + k: sums.get(k, 0.0) for k in [*per_token(), "tokens"]})
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
        self._statistics.add(lprobs, mask, self.model.target_log_unigram, extra.get(PRIOR_ROWS_KEY))

    def bias_statistics(self) -> dict:
        decoder, stats = self.model.decoder, Statistics()
        beta = getattr(getattr(decoder, "bigram_residual", None), "weight", None)  # order 2's
        p = decoder.output_projection
        stats.add_head(p.bias, self.model.target_log_unigram, p.weight, p.gain(), beta)
        return stats.values

    def log(self, logging_outputs) -> None:
        """What :data:`METRICS` lists: the per-token statistics weighted by their tokens."""
        _drop_empty_meters()
        totals = Statistics()
        for k in [*per_token(), "tokens"]:
            totals.sums[k] = float(sum(o.get("natbias_" + k, 0.0) for o in logging_outputs))
        if self._log_bias_now:
            self._log_bias_now, totals.values = False, self.bias_statistics()
        values = totals.bits()
        for name, metric in METRICS.items():
            weight = totals.sums["tokens"] if metric.reduce == "tokens" else 1
            if name in values and weight > 0:
                metrics.log_scalar(name, values[name], weight, round=metric.digits)


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
        for key in METRICS:
            if key in meters and getattr(meters[key], "count", 1) == 0:
                del meters[key]
                meters.priorities = [p for p in meters.priorities if p[2] != key]
