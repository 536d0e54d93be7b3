"""natbias.metrics is the one table of what is logged: fairseq's log hook, the
transformers and OLMo-core callbacks log exactly its names (those each can
measure), --no-natbias-logging's help and natbias-dynamics' labels and help
list them, and a statistic added to the table and to the accumulator
(natbias.statistics) alone reaches every log, with the value computed here
from the model's own logits and bias in float64.
"""

import argparse
import importlib
import math
from types import SimpleNamespace

import pytest
import torch
from fairseq.logging import metrics
from natbias_testing import build_in_process, first_sentences

from fairseq_natbias import options
from natbias.metrics import METRICS, Metric, per_token
from natbias.statistics import Statistics

LN2 = math.log(2.0)
# What the callbacks cannot measure: beta exists in fairseq's order-2 models
# only, and OLMo-core's callback has no probe batch for the per-token ones.
FAIRSEQ_ONLY = {"bigram_weight"}


def fairseq_logged(tmp_path, toy_bin, *extra):
    """What the hook logs (bits, as fairseq rounds them) for one validation
    step of a fresh order-2 model, and the model and batch."""
    task, model, criterion = build_in_process(
        toy_bin, tmp_path, "--natbias-order", "2", "--dropout", "0", *extra
    )
    sample = first_sentences(task, split="valid")
    out = task.valid_step(sample, model, criterion)[2]
    with metrics.aggregate(new_root=True) as agg:
        model.natbias_hook.log([out])
    return agg.get_smoothed_values(), model, sample, task.target_dictionary.pad()


def hf_model_and_probe():
    pytest.importorskip("transformers")
    from hf_tiny import build, zipf_targets

    import natbias.hf

    model = natbias.hf.add_natural_bias(build("gpt2"), zipf_targets()).eval()
    data = zipf_targets(8, seed=1)
    width = max(len(t) for t in data)
    ids = torch.tensor([t + [0] * (width - len(t)) for t in data])
    probe = {"input_ids": ids, "attention_mask": ids.ne(0).long()}
    return model, dict(probe, labels=ids.masked_fill(ids.eq(0), -100))


def hf_logged(model, probe):
    """The keys the callback adds to a Trainer's log (rounded as it logs them)."""
    from natbias.hf import BiasStatisticsCallback

    logs = {"loss": 1.0}
    state = SimpleNamespace(is_world_process_zero=True, log_history=[])
    BiasStatisticsCallback(probe).on_log(
        SimpleNamespace(report_to=[]), state, None, model=model, logs=logs
    )
    del logs["loss"]
    return logs


def olmo_recorded():
    """What NaturalBiasCallback records for one step of a fresh OLMo-core
    model (1M preset) given the natural bias, and the model."""
    pytest.importorskip("olmo_core")
    import olmo_tiny

    from natbias.olmo_core import NaturalBiasCallback, add_natural_bias

    torch.manual_seed(0)
    model = olmo_tiny.model_1m(meta=False)
    vocab = model.lm_head.w_out.weight.shape[0]
    add_natural_bias(model, counts=[1 + (7 * i) % 50 for i in range(vocab)])
    recorded = {}
    callback = NaturalBiasCallback()
    callback.trainer = SimpleNamespace(
        train_module=SimpleNamespace(model=model),
        record_metric=lambda name, value, namespace: recorded.update(
            {f"{namespace}/{name}": value}
        ),
    )
    callback.pre_train()
    callback.post_step()
    return recorded, model


def help_names():
    parser = argparse.ArgumentParser()
    options.add_args(parser)
    (action,) = [a for a in parser._actions if "--no-natbias-logging" in a.option_strings]
    return action.help.removeprefix("do not log ").split(", ")


def test_every_engine_logs_exactly_the_tables_names(tmp_path, toy_bin):
    assert sorted(fairseq_logged(tmp_path, toy_bin)[0]) == sorted(METRICS)
    assert sorted(hf_logged(*hf_model_and_probe())) == sorted(set(METRICS) - FAIRSEQ_ONLY)
    expected = {f"natbias/{n}" for n in set(METRICS) - FAIRSEQ_ONLY - set(per_token())}
    assert set(olmo_recorded()[0]) == expected
    assert help_names() == list(METRICS)
    from natbias.tools import cli, dynamics

    assert set(METRICS) <= set(dynamics.LABELS)
    assert ", ".join(METRICS) in cli.DYNAMICS_DOC  # natbias-dynamics --help


@pytest.fixture
def two_more_statistics(monkeypatch):
    """A per-token statistic (the entropy of p, bits) and one of the output
    layer (max_v b_v), written as a contributor would: a row each in the
    table, and their computation in the accumulator; nothing else."""
    monkeypatch.setitem(METRICS, "entropy", Metric("H(p)", "bits", "tokens", 3))
    monkeypatch.setitem(METRICS, "bias_max", Metric("max b", "", "same", 4))
    add, add_head = Statistics.add, Statistics.add_head

    def add_with_entropy(self, log_probs, mask, *args, **kwargs):
        add(self, log_probs, mask, *args, **kwargs)
        log_p = log_probs.detach().float()
        entropy = -((log_p.exp() * log_p).sum(-1) * mask).sum().to(self.dtype)
        self.sums["entropy"] = self.sums.get("entropy", 0.0) + entropy

    def add_head_with_bias_max(self, bias, *args, **kwargs):
        add_head(self, bias, *args, **kwargs)
        self.values["bias_max"] = bias.detach().float().max().item()

    monkeypatch.setattr(Statistics, "add", add_with_entropy)
    monkeypatch.setattr(Statistics, "add_head", add_head_with_bias_max)
    from natbias.tools import dynamics

    yield importlib.reload(dynamics)
    monkeypatch.undo()
    importlib.reload(dynamics)


def entropy_bits(logits, mask):
    """Mean over the masked positions of H(softmax(logits)) in bits, float64."""
    log_p = torch.log_softmax(logits.double(), -1)
    return (-(log_p.exp() * log_p).sum(-1)[mask].mean() / LN2).item()


def test_a_statistic_added_to_the_table_and_the_accumulator_reaches_every_log(
    tmp_path, toy_bin, two_more_statistics
):
    values, model, sample, pad = fairseq_logged(tmp_path, toy_bin)
    with torch.no_grad():
        logits = model(**sample["net_input"])[0]
    # fairseq rounds to 3 (4) decimals: 5e-4 (5e-5), plus float32's 1e-6
    assert values["entropy"] == pytest.approx(
        entropy_bits(logits, sample["target"].ne(pad)), abs=5.1e-4
    )
    b = model.decoder.output_projection.bias.detach().double()
    assert values["bias_max"] == pytest.approx(b.max().item(), abs=5.1e-5)

    model, probe = hf_model_and_probe()
    logged = hf_logged(model, probe)
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]).logits
    mask = probe["labels"][:, 1:].ne(-100)
    # rounded to 4 decimals as the Trainer logs them
    assert logged["entropy"] == pytest.approx(entropy_bits(logits[:, :-1], mask), abs=5.1e-5)
    assert logged["bias_max"] == pytest.approx(
        model.bias_in_logits().detach().double().max().item(), abs=5.1e-5
    )

    recorded, model = olmo_recorded()
    assert recorded["natbias/bias_max"] == model.lm_head.w_out.bias.detach().double().max().item()
    assert "entropy" in help_names() and "bias_max" in help_names()
    assert two_more_statistics.LABELS["entropy"] == "H(p) (bits)"
