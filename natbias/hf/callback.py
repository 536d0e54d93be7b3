"""A ``TrainerCallback`` that writes the bias statistics (:mod:`natbias.statistics`)
into the Trainer's logs: ``bias_kl``, ``bias_norm``, ``weight_norm`` and
``gain`` at every log, and, given a probe batch, ``kl_unigram`` and
``kl_uniform``: the model's mean divergence from the unigram and the uniform
over the probe's target tokens (the paper's Fig. 1).

    callback = BiasStatisticsCallback(probe=collator([eval_dataset[i] for i in range(64)]))
    trainer = Seq2SeqTrainer(..., callbacks=[callback])

They go into ``trainer.state.log_history`` and what the Trainer prints;
reporting callbacks placed before this one (``report_to``) log without them.
"""

from typing import Optional

import torch
from transformers import TrainerCallback

from natbias.counts import IGNORE_INDEX
from natbias.statistics import LN2, bias_statistics, divergence_sums


class BiasStatisticsCallback(TrainerCallback):
    def __init__(self, probe: Optional[dict] = None):
        self.probe = probe

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if model is None or logs is None or getattr(model, "natbias_log_prior", None) is None:
            return
        stats = statistics(model, self.probe)
        logs.update(stats)
        if state.log_history:
            state.log_history[-1].update(stats)


def statistics(model, probe: Optional[dict] = None) -> dict:
    """The statistics of a natural-bias model, rounded as the Trainer logs them."""
    head = model.get_output_embeddings()
    stats = bias_statistics(
        model.output_bias(), model.natbias_log_prior, head.weight, model.output_gain()
    )
    if probe is not None:
        stats.update(probe_divergences(model, probe))
    return {key: round(value, 4) for key, value in stats.items()}


@torch.no_grad()
def probe_divergences(model, batch: dict) -> dict:
    """``kl_unigram`` and ``kl_uniform`` (bits) over the batch's target tokens."""
    training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
        labels = batch["labels"].to(device)
        logits = model(**inputs).logits
        if not getattr(model.config, "is_encoder_decoder", False):
            logits, labels = logits[:, :-1], labels[:, 1:]
        kl_unigram, kl_uniform, tokens = divergence_sums(
            torch.log_softmax(logits.float(), -1), labels.ne(IGNORE_INDEX), model.natbias_log_prior
        )
    finally:
        model.train(training)
    tokens = max(tokens.item(), 1.0)
    return {
        "kl_unigram": kl_unigram.item() / tokens / LN2,
        "kl_uniform": kl_uniform.item() / tokens / LN2,
    }
