"""The natural bias for users of OLMo-core's training scripts: a trainer
callback, and the bias statistics in OLMo-core's metrics.

    trainer_config.with_callback("natbias", NaturalBiasCallback())

At every step the callback records the output layer's statistics of
:mod:`natbias.metrics` as ``natbias/bias_kl`` etc. with
``Trainer.record_metric``, so they reach every metrics destination the
trainer has (console, W&B, Comet, the metrics saver). Under FSDP and tensor
parallelism every process gathers b and the norm of W (collectives), as
each takes part.

Two kinds of model:

* one given the natural bias by :func:`natbias.olmo_core.add_natural_bias`
  (b and the gain; recommended): the callback only records the statistics;
* a stock model whose head was built with a bias
  (``LMHeadConfig(bias=True)``, which the presets leave out): before the
  first step of a run that resumes no checkpoint, the callback writes the
  log-unigram of the data loader's dataset into that bias (sharded or not).
  Without the gain (g = 1), W phi at initialisation moves the start off the
  unigram by what OLMo-core's init makes it.

A resumed run takes b (and the gain) from OLMo-core's checkpoint.
"""

from dataclasses import dataclass
from typing import Optional

import torch

from natbias.errors import NaturalBiasError
from natbias.metrics import METRICS
from natbias.olmo_core import _compat
from natbias.olmo_core.natural_bias import NaturalBiasModel, count_targets
from natbias.prior import DEFAULT_SMOOTHING, log_unigram
from natbias.sharding import fill_
from natbias.statistics import Statistics

NAMESPACE = "natbias"


def statistics(model, log_prior: Optional[torch.Tensor] = None) -> dict:
    """``bias_kl``, ``bias_norm``, ``weight_norm`` and ``gain`` of the model's
    head (a collective where it is sharded: call it on every process)."""
    head = _compat.head_of(model)[1]
    log_prior = model.natbias_log_prior if log_prior is None else log_prior
    gain, stats = head.gain() if hasattr(head, "gain") else None, Statistics()
    with torch.no_grad():
        stats.add_head(head.bias, log_prior, head.weight, gain)
    return stats.values


@dataclass
class NaturalBiasCallback(_compat.Callback):
    """Records the bias statistics each step; writes b into a stock head's
    bias before a fresh run (see the module's docstring)."""

    smoothing: float = DEFAULT_SMOOTHING
    enabled: bool = True

    def pre_train(self):
        if not self.enabled:
            return
        model = self.trainer.train_module.model
        self._log_prior = None
        if isinstance(model, NaturalBiasModel):
            return
        linear = _compat.head_of(model)[1]
        if linear.bias is None:
            raise NaturalBiasError(
                "the model's LM head has no bias: build it with LMHeadConfig(bias=True), or "
                "call natbias.olmo_core.add_natural_bias(model, dataset) before the train module"
            )
        counts = count_targets(self.trainer.data_loader.dataset, linear.weight.shape[0])
        self._log_prior = log_unigram(counts, self.smoothing)
        if self.trainer.global_step == 0 and not self.trainer.checkpoint_loaded:
            fill_(linear.bias, self._log_prior)

    def post_step(self):
        if not self.enabled:
            return
        stats = statistics(self.trainer.train_module.model, self._log_prior)
        for name in (name for name in METRICS if name in stats):  # b, W, g: the same on every rank
            self.trainer.record_metric(name, stats[name], namespace=NAMESPACE)
