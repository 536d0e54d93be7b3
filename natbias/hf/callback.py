"""The bias statistics (:mod:`natbias.statistics`) in the Trainer's logs and in
every ``report_to`` integration, at every training log (those with the loss);
given a probe batch, also ``kl_unigram`` and ``kl_uniform`` (the paper's Fig. 1).

    natbias.hf.log_bias_statistics(trainer, probe=collator([eval_dataset[i] for i in range(64)]))

Why a callback placed first: the Trainer calls its callbacks' ``on_log`` in
order, all with the same ``logs`` dict: DefaultFlowCallback, the
``report_to`` integrations (TensorBoard, W&B, ...), then the ``callbacks=``
given to it, whose keys come after the integrations have written.
:func:`log_bias_statistics` puts it ahead of them, so each integration
writes the statistics with the loss. Overriding ``Trainer.log`` (transformers'
other hook for this) would need a subclass of each trainer class a user has
(Trainer, Seq2SeqTrainer, TRL's); the callback composes with any of them.

Only the main process computes them, as only it reports: b, W and the gain
are the same in every process under DDP. Where the model is sharded
(:mod:`natbias.hf.sharded`, which says why FSDP1 needs the trainer's
wrapper), every process takes part in the gathers and the probe's forward.
"""

import warnings
import weakref
from typing import Optional

import torch
from transformers import TrainerCallback

from natbias.counts import IGNORE_INDEX
from natbias.hf.sharded import check_reachable, gathered, is_sharded, runner
from natbias.metrics import METRICS
from natbias.statistics import Statistics


class BiasStatisticsCallback(TrainerCallback):
    """Adds the statistics to each log. Given in ``callbacks=``, it comes
    after the ``report_to`` integrations, which then log without them (it
    warns once): add it with :func:`log_bias_statistics` instead."""

    def __init__(self, probe: Optional[dict] = None):
        self.probe = probe
        self.before_reporting = False  # placed ahead of the integrations
        self._warned = False
        self._trainer = None  # a weak reference, set by log_bias_statistics

    def wrapped(self):
        """The model the trainer trains (its wrapper), where the callback knows the trainer."""
        trainer = self._trainer() if self._trainer is not None else None
        return getattr(trainer, "model_wrapped", None)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None and getattr(model, "natbias_log_prior", None) is not None:
            check_reachable(model, self.wrapped())  # FSDP1 without its wrapper: refused now

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if model is None or logs is None or getattr(model, "natbias_log_prior", None) is None:
            return
        if "loss" not in logs:  # an evaluation's, or the run's summary: at the same step
            return
        main = state.is_world_process_zero
        if not (main or is_sharded(model)):
            return
        if main and args.report_to and not self.before_reporting and not self._warned:
            self._warned = True
            warnings.warn(
                f"BiasStatisticsCallback runs after the report_to integrations "
                f"({', '.join(args.report_to)}), which log without the bias statistics: "
                "add it with natbias.hf.log_bias_statistics(trainer) instead",
                stacklevel=2,
            )
        stats = statistics(model, self.probe, self.wrapped())
        if not main:
            return
        logs.update(stats)
        if state.log_history:  # the Trainer appended a copy of logs before on_log
            state.log_history[-1].update(stats)


def log_bias_statistics(trainer, probe: Optional[dict] = None) -> BiasStatisticsCallback:
    """Adds a :class:`BiasStatisticsCallback` to ``trainer`` ahead of its
    ``report_to`` integrations, so that they log the statistics too."""
    callback = BiasStatisticsCallback(probe)
    callback.before_reporting = True
    callback._trainer = weakref.ref(trainer)
    trainer.callback_handler.callbacks.insert(0, callback)
    return callback


def statistics(
    model, probe: Optional[dict] = None, wrapped=None, digits: Optional[int] = 4
) -> dict:
    """The statistics of a natural-bias model, rounded to ``digits`` decimals
    as the Trainer logs them (None: unrounded, to compare runs); bias_kl and
    bias_norm of b as the logits see it. Under sharding, call it on every
    process; under FSDP1 with ``model`` inside its wrapper, give the wrapper
    as ``wrapped`` (:mod:`natbias.hf.sharded`)."""
    stats = Statistics()
    with gathered(model, wrapped):
        head = model.get_output_embeddings()
        stats.add_head(
            model.bias_in_logits(), model.natbias_log_prior, head.weight, model.output_gain()
        )
    if probe is not None:
        probe_divergences(model, probe, stats, runner(model, wrapped))
    stats = {key: value for key, value in stats.bits().items() if key in METRICS}
    return stats if digits is None else {key: round(v, digits) for key, v in stats.items()}


@torch.no_grad()
def probe_divergences(model, batch: dict, stats: Statistics, run) -> None:
    """Adds the batch's per-token statistics to ``stats``, the forward through ``run``."""
    training = run.training
    run.eval()
    try:
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        labels = batch["labels"].to(device)
        logits = run(**inputs).logits
        if not getattr(model.config, "is_encoder_decoder", False):
            logits, labels = logits[:, :-1], labels[:, 1:]
        log_probs = torch.log_softmax(logits.float(), -1)
        stats.add(log_probs, labels.ne(IGNORE_INDEX), model.natbias_log_prior)
    finally:
        run.train(training)
