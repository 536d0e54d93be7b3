"""Logs how far the output bias and the model are from the target unigram
(App. A.6, Figs. 13 and 14; Fig. 1).

Keys added to fairseq's own ``train_inner``, ``train`` and ``valid`` logs (and
so to ``--tensorboard-logdir`` and ``--log-format json``), all divergences in
bits, like fairseq's ``loss``:

``bias_kl``      KL(softmax(b) || unigram) of the output bias b (Fig. 13)
``bias_norm``    ||b||_2 (Fig. 14)
``weight_norm``  ||g W||_F: the matrix that maps phi to the contextual logits
                 (||W||_F for weight inits without the gain g)
``gain``         g, the learnt scalar gain on W phi (weight init ``gain`` only)
``bigram_weight`` beta, the learnt weight of the bigram residual (``--natbias-order 2`` only)
``kl_unigram``   mean over target tokens of KL(p_theta(.|y_<t) || unigram) (Fig. 1)
``kl_uniform``   mean over target tokens of KL(p_theta(.|y_<t) || uniform) (Fig. 1)

The per-token divergences reuse the log-probabilities the criterion asks the
model for (``get_normalized_probs``): no second softmax, only an ``exp`` and two
reductions over the vocabulary, in float32 whatever the model's precision, a
chunk of tokens at a time (``STATS_CHUNK_ELEMENTS`` float32 entries per
temporary, three temporaries: ~100 MiB at most instead of two tokens x |V|
float32 tensors, 2 GiB for 8k tokens and a 32k vocabulary). They
are accumulated as tensors on the model's device (no host synchronisation per
step; the numbers are read once, when a log line is written) and travel in
the logging outputs as sums with a token count, so fairseq's own reduction across micro-batches
(``--update-freq``) and workers weights every token once. Bias statistics are
read from the model's current parameters in ``reduce_metrics``, once per
logged update, so they are never summed over workers or micro-batches.

To stay cheap in training, the per-token divergences are computed on every
``--natbias-stats-interval``-th update (default: ``--log-interval``, so every
``train_inner`` line has them) and on every validation batch.

The hook is attached to the task instance the model is built for: it wraps
``train_step`` / ``valid_step`` (to add its sums to the logging output) and
``reduce_metrics`` (to log them). That is what makes it work with any criterion.
"""

import logging
import math

import torch
from fairseq.logging import metrics

from fairseq_natbias.output_projection import contextual_weight_norm, output_gain

logger = logging.getLogger(__name__)

LN2 = math.log(2.0)
TARGET_MASK_KEY = "natbias_target_mask"
SUM_KEYS = ("natbias_kl_unigram", "natbias_kl_uniform", "natbias_tokens")
# float32 entries in one chunk of the per-token statistics (32 MiB a temporary).
STATS_CHUNK_ELEMENTS = 1 << 23


def kl_from_log_probs(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) = sum_v p(v) (log p(v) - log q(v)), over the last dim, in nats."""
    p = log_p.exp()
    return (p * (log_p - log_q)).sum(-1)


class BiasDivergenceHook:
    def __init__(self, model, stats_interval: int):
        self.model = model
        self.stats_interval = max(1, int(stats_interval))
        self.armed = False
        self.chunk_elements = STATS_CHUNK_ELEMENTS
        self._log_bias_now = False
        self._sums = dict.fromkeys(SUM_KEYS, 0.0)
        if model.decoder.output_projection.bias is None:
            logger.info(
                "natbias: this model has no output bias (--natbias-init none); "
                "logging kl_unigram, kl_uniform and weight_norm only"
            )

    # --- wiring into the task -------------------------------------------------

    def attach(self, task) -> None:
        """Wrap the task's methods once; they dispatch to the hook of the
        latest model built for the task (the one the model's own ``forward``
        consults), so a second model built on the same task is measured too.

        Why wrap the task: the hook has to know whether a step is a training
        step due for statistics or a validation step, to add its sums to that
        step's logging output, and to log after fairseq reduces them, whatever
        the criterion. In fairseq 0.12 only the task's ``train_step``,
        ``valid_step`` and ``reduce_metrics`` see all three; the model hears of
        the update count alone (``set_num_updates``) and a criterion is the
        user's choice. Subclassing the task would need a task of our own per
        fairseq task (translation, language_modeling, ...), and a user's own
        task would lose the hook."""
        already_wrapped = getattr(task, "_natbias_hook", None) is not None
        task._natbias_hook = self
        if already_wrapped:
            return
        train_step, valid_step = task.train_step, task.valid_step
        reduce_metrics = task.reduce_metrics

        def hooked_train_step(sample, model, criterion, optimizer, update_num, *a, **k):
            hook = task._natbias_hook
            hook.armed = (update_num + 1) % hook.stats_interval == 0
            hook._log_bias_now = hook._log_bias_now or hook.armed
            try:
                out = train_step(sample, model, criterion, optimizer, update_num, *a, **k)
            finally:
                hook.armed = False
            return hook._with_sums(out)

        def hooked_valid_step(sample, model, criterion, *a, **k):
            hook = task._natbias_hook
            hook.armed = True
            hook._log_bias_now = True
            try:
                out = valid_step(sample, model, criterion, *a, **k)
            finally:
                hook.armed = False
            return hook._with_sums(out)

        def hooked_reduce_metrics(logging_outputs, criterion):
            reduce_metrics(logging_outputs, criterion)
            task._natbias_hook.log(logging_outputs)

        task.train_step = hooked_train_step
        task.valid_step = hooked_valid_step
        task.reduce_metrics = hooked_reduce_metrics

    def _with_sums(self, step_output):
        loss, sample_size, logging_output = step_output
        # Always the same keys on every worker: fairseq's fast all-reduce of
        # logging outputs stacks values key by key.
        logging_output.update(self._sums)
        self._sums = dict.fromkeys(SUM_KEYS, 0.0)
        return loss, sample_size, logging_output

    # --- measuring ------------------------------------------------------------

    def observe(self, lprobs: torch.Tensor, net_output) -> None:
        """Accumulate per-token divergences of one forward pass (called by the
        model's ``get_normalized_probs``; once per ``net_output``)."""
        extra = net_output[1] if len(net_output) > 1 else None
        if not self.armed or not isinstance(extra, dict):
            return
        mask = extra.pop(TARGET_MASK_KEY, None)  # pop: count each output once
        if mask is None:
            return
        with torch.no_grad():
            sums = self.divergence_sums(lprobs.detach(), mask)
        # Tensors on the model's device: summing them forces no host sync.
        for key, value in zip(SUM_KEYS, sums):
            self._sums[key] = self._sums[key] + value

    def divergence_sums(self, lprobs: torch.Tensor, mask: torch.Tensor):
        """Sums over the unmasked positions of KL(p || unigram) and
        KL(p || uniform) in nats, and their count, as float32 tensors, computed
        ``chunk_elements`` float32 entries at a time:

            KL(p || q) = sum_v p(v) log p(v) - sum_v p(v) log q(v)
        """
        vocab = lprobs.size(-1)
        log_p = lprobs.reshape(-1, vocab)
        weights = mask.reshape(-1)
        log_u = self.model.target_log_unigram.to(log_p.device, torch.float32)
        rows = max(1, self.chunk_elements // vocab)
        kl_unigram = kl_uniform = log_p.new_zeros((), dtype=torch.float32)
        for start in range(0, log_p.size(0), rows):
            chunk = log_p[start:start + rows].float()
            p = chunk.exp()
            neg_entropy = (p * chunk).sum(-1)
            cross_unigram = torch.matmul(p, log_u)
            w = weights[start:start + rows].to(torch.float32)
            kl_unigram = kl_unigram + ((neg_entropy - cross_unigram) * w).sum()
            kl_uniform = kl_uniform + ((neg_entropy + math.log(vocab)) * w).sum()
        return kl_unigram, kl_uniform, weights.sum().to(torch.float32)

    def bias_statistics(self) -> dict:
        decoder = self.model.decoder
        stats = {"weight_norm": contextual_weight_norm(decoder)}
        gain = output_gain(decoder)
        if gain is not None:
            stats["gain"] = gain.detach().float().item()
        residual = getattr(decoder, "bigram_residual", None)
        if residual is not None:
            stats["bigram_weight"] = residual.weight.detach().float().item()
        bias = decoder.output_projection.bias
        if bias is not None:
            b = bias.detach().float()
            log_u = self.model.target_log_unigram.to(b.device)
            stats["bias_norm"] = b.norm().item()
            kl = kl_from_log_probs(b.log_softmax(-1), log_u).item() / LN2
            stats["bias_kl"] = max(0.0, kl)  # KL >= 0; float error printed "-0"
        return stats

    def log(self, logging_outputs) -> None:
        tokens = float(sum(log.get("natbias_tokens", 0.0) for log in logging_outputs))
        if tokens > 0:
            for key in ("kl_unigram", "kl_uniform"):
                total = float(sum(log.get("natbias_" + key, 0.0) for log in logging_outputs))
                metrics.log_scalar(key, total / tokens / LN2, tokens, round=3)
        if self._log_bias_now:
            self._log_bias_now = False
            for key, value in self.bias_statistics().items():
                metrics.log_scalar(key, value, 1, round=4)
