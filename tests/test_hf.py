"""The transformers extra (natbias.hf) on tiny models: the bias counted and
set, reloads that are exact, the loss, the callback and the logits processor
through the real Trainer and generate. No fairseq."""

import collections
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from datasets import Dataset  # noqa: E402
from hf_tiny import V, build, zipf_targets  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    LogitsProcessorList,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from natbias import FORMAT_VERSION  # noqa: E402
from natbias.counts import write_counts_file  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import (  # noqa: E402
    BiasScaleLogitsProcessor,
    BiasStatisticsCallback,
    UnigramLabelSmoothingLoss,
    add_natural_bias,
    count_targets,
    from_pretrained,
)


# test_hf's own variants of hf_tiny's configurations, kept as these tests were written.
def marian():
    return build("marian")


def bart():
    return build("bart", decoder_start_token_id=1)


def gpt2():
    return build("gpt2")


def llama():
    return build("llama", num_key_value_heads=2)


MODELS = {
    "marian": (marian, AutoModelForSeq2SeqLM),
    "bart": (bart, AutoModelForSeq2SeqLM),
    "gpt2": (gpt2, AutoModelForCausalLM),
    "llama": (llama, AutoModelForCausalLM),
}


def hand_log_prior(sequences, causal, alpha=1.0):
    """log (c(v) + alpha) / (N + alpha V), counted with a Counter."""
    counter = collections.Counter()
    for sequence in sequences:
        counter.update(sequence[1:] if causal else sequence)
    counts = np.array([counter[i] for i in range(V)], dtype=np.float64)
    return np.log((counts + alpha) / (counts.sum() + alpha * V))


def inputs_for(name):
    torch.manual_seed(3)
    ids = torch.randint(3, V, (2, 6))
    if MODELS[name][1] is AutoModelForSeq2SeqLM:
        return dict(input_ids=ids, decoder_input_ids=torch.randint(3, V, (2, 5)))
    return dict(input_ids=ids)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_bias_is_the_smoothed_log_unigram_of_the_targets(name):
    torch.manual_seed(0)
    stock = MODELS[name][0]()
    targets = zipf_targets()
    model = add_natural_bias(stock, targets)
    causal = name in ("gpt2", "llama")
    expected = hand_log_prior(targets, causal)
    np.testing.assert_allclose(model.output_bias().detach().double().numpy(), expected, atol=1e-6)
    assert torch.equal(model.natbias_log_prior, model.output_bias().detach())
    assert model.output_gain().item() == pytest.approx(0.05)
    # Every other parameter is the stock model's own, tied embeddings still tied.
    ours = model.state_dict()
    for key, value in stock.state_dict().items():
        if key != "final_logits_bias":
            assert torch.equal(ours[key], value), key
    tied = stock.get_output_embeddings().weight is stock.get_input_embeddings().weight
    assert tied == (name != "llama")  # Llama unties by default
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    assert model.config.natural_bias["format_version"] == FORMAT_VERSION
    assert model.config.natural_bias["prior_tokens"] == sum(
        len(t) - (1 if causal else 0) for t in targets
    )


def test_a_fresh_model_predicts_the_prior():
    """Update 0: with g = 0.05 the contextual logits barely move softmax(b)."""
    torch.manual_seed(0)
    model = add_natural_bias(marian(), zipf_targets()).eval()
    with torch.no_grad():
        logits = model(**inputs_for("marian")).logits
    log_p = torch.log_softmax(logits, -1)
    kl = (log_p.exp() * (log_p - model.natbias_log_prior)).sum(-1)
    assert kl.max().item() < 1e-3


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_saved_model_reloads_with_identical_logits_and_beams(name, tmp_path):
    torch.manual_seed(0)
    model = add_natural_bias(MODELS[name][0](), zipf_targets())
    with torch.no_grad():  # as if trained: b and g moved
        model.output_bias().add_(torch.randn(V) * 0.1)
        model.get_output_embeddings().gain_param.fill_(0.02)
    model.eval()
    model.save_pretrained(tmp_path)
    inputs = inputs_for(name)
    with torch.no_grad():
        before = model(**inputs).logits
    for loaded in (from_pretrained(tmp_path), MODELS[name][1].from_pretrained(tmp_path)):
        assert type(loaded) is type(model)
        loaded.eval()
        with torch.no_grad():
            assert (loaded(**inputs).logits - before).abs().max().item() == 0
        assert loaded.output_gain().item() == pytest.approx(0.4)
        beams = [
            m.generate(inputs["input_ids"], num_beams=3, max_new_tokens=5, do_sample=False)
            for m in (model, loaded)
        ]
        assert torch.equal(*beams)


def test_a_model_without_the_natural_bias_is_refused_by_from_pretrained(tmp_path):
    gpt2().save_pretrained(tmp_path)
    with pytest.raises(NaturalBiasError, match="records no 'natural_bias' settings"):
        from_pretrained(tmp_path)


def test_a_newer_format_is_refused(tmp_path):
    model = add_natural_bias(gpt2(), zipf_targets())
    newer = FORMAT_VERSION + 1
    model.config.natural_bias = {**model.config.natural_bias, "format_version": newer}
    model.save_pretrained(tmp_path)
    with pytest.raises(
        NaturalBiasError,
        match=f"format {newer}; natbias .* reads format {FORMAT_VERSION} and earlier: upgrade",
    ):
        from_pretrained(tmp_path)


def test_the_prior_from_counts_a_counts_file_or_a_dataset_is_the_same(tmp_path):
    targets = zipf_targets()
    counts = count_targets(targets, V)
    symbols = [f"w{i}" for i in range(V)]
    write_counts_file(str(tmp_path / "c.counts"), symbols, counts)

    class Vocabulary:  # what a tokenizer offers
        def convert_ids_to_tokens(self, ids):
            return [symbols[i] for i in ids]

    biases = [
        add_natural_bias(marian(), **source).output_bias().detach()
        for source in (
            {"targets": targets},
            {"counts": counts},
            {
                "targets": Dataset.from_dict(
                    {"input_ids": [t[::-1] for t in targets], "labels": targets}
                )
            },
            {"counts_file": str(tmp_path / "c.counts"), "vocabulary": Vocabulary()},
        )
    ]
    assert all(torch.equal(biases[0], bias) for bias in biases[1:])
    with pytest.raises(NaturalBiasError, match="exactly one of targets"):
        add_natural_bias(marian(), targets, counts=counts)
    with pytest.raises(NaturalBiasError, match="outside the vocabulary of 40 entries"):
        add_natural_bias(marian(), [[3, 4, 99]])


def test_the_loss_by_hand():
    """The hand-worked example of the fairseq criterion's test: eps 0.1,
    omega (0.5, 0, 0.3, 0.2), p (0.5, 0, 0.25, 0.25), y = 0:
    0.9 ln 2 + 0.1 (0.5 ln 2 + 0.3 ln 4 + 0.2 ln 4) = 0.727805 nats; the
    second position is ignored (-100)."""
    loss = UnigramLabelSmoothingLoss(torch.tensor([0.5, 1e-30, 0.3, 0.2]).log(), 0.1)
    logits = torch.tensor([[[0.5, 1e-30, 0.25, 0.25], [0.25, 1e-30, 0.5, 0.25]]]).log()
    value = loss({"logits": logits}, torch.tensor([[0, -100]]))
    assert value.item() == pytest.approx(0.727805, abs=1e-6)
    causal = UnigramLabelSmoothingLoss(torch.tensor([0.5, 1e-30, 0.3, 0.2]).log(), 0.1, causal=True)
    shifted = torch.cat([logits, logits[:, :1]], dim=1)  # position t predicts label t + 1
    assert causal({"logits": shifted}, torch.tensor([[7, 0, -100]])).item() == pytest.approx(
        0.727805, abs=1e-6
    )


def _trainer(model, callbacks=(), loss=None, steps=3, out=None, label_smoothing=0.0):
    targets = zipf_targets(64)
    data = [{"input_ids": t[::-1], "labels": t} for t in targets]

    class Tokenizer:  # what the collator needs of one
        pad_token_id = 0
        padding_side = "right"

        def pad(self, features, return_tensors=None, **kwargs):
            width = max(len(f["input_ids"]) for f in features)
            ids = torch.tensor(
                [f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]
            )
            return {"input_ids": ids, "attention_mask": ids.ne(0).long()}

    collator = DataCollatorForSeq2Seq(Tokenizer(), model=model, label_pad_token_id=-100)
    args = Seq2SeqTrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        logging_steps=1,
        per_device_train_batch_size=16,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        learning_rate=1e-2,
        label_smoothing_factor=label_smoothing,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collator,
        compute_loss_func=loss,
        callbacks=list(callbacks),
    )
    return trainer, collator(data[:8])


@pytest.mark.training
def test_the_trainer_trains_with_the_loss_and_logs_the_statistics(tmp_path):
    torch.manual_seed(0)
    model = add_natural_bias(marian(), zipf_targets())
    loss = UnigramLabelSmoothingLoss.from_model(model, 0.1)
    callback = BiasStatisticsCallback(probe=None)
    trainer, probe = _trainer(model, [callback], loss, out=tmp_path)
    # The loss the Trainer gets is ours, computed on the model's logits:
    model.eval()
    outputs = model(**{k: v for k, v in probe.items() if k != "labels"})
    ours = loss(outputs, probe["labels"])
    assert trainer.compute_loss(model, dict(probe)).item() == pytest.approx(ours.item())
    model.train()
    callback.probe = probe
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    for entry in logged:
        assert {"bias_kl", "bias_norm", "weight_norm", "gain", "kl_unigram", "kl_uniform"} <= set(
            entry
        )
        assert all(math.isfinite(entry[key]) for key in ("bias_kl", "kl_unigram", "gain"))
    assert logged[-1]["gain"] != pytest.approx(0.05, abs=1e-4)  # the gain moved


def test_the_trainer_shifts_a_natural_bias_decoders_labels(tmp_path):
    """transformers' label_smoothing_factor shifts the labels of the causal
    LMs it knows by name: a natural-bias class joins them when it is made,
    and the Trainer's smoothed loss is then that of the shifted labels."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model = add_natural_bias(gpt2(), zipf_targets()).eval()
    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES["natbias-gpt2"] == "NaturalBiasGPT2LMHeadModel"
    add_natural_bias(marian(), zipf_targets())  # a seq2seq model: not shifted
    assert "NaturalBiasMarianMTModel" not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    trainer, batch = _trainer(model, label_smoothing=0.1, out=tmp_path)
    batch = {"input_ids": batch["labels"].clamp(min=0), "labels": batch["labels"]}
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        labels = batch["labels"][:, 1:]
        mask = labels.ne(-100)
        log_p = torch.log_softmax(logits[mask], -1)
        nll = -log_p.gather(-1, labels[mask].unsqueeze(-1)).mean()
        expected = 0.9 * nll - 0.1 * log_p.mean(-1).mean()
        assert trainer.compute_loss(model, batch).item() == pytest.approx(expected.item(), 1e-5)


def test_the_logits_processor_scales_the_bias_and_renormalises():
    torch.manual_seed(0)
    model = add_natural_bias(gpt2(), zipf_targets()).eval()
    scores = torch.log_softmax(torch.randn(2, V), -1)
    same = BiasScaleLogitsProcessor(model, 1.0)(None, scores)
    torch.testing.assert_close(same, scores)
    half = BiasScaleLogitsProcessor(model, 0.5)(None, scores)
    expected = torch.log_softmax(scores - 0.5 * model.output_bias().detach(), -1)
    torch.testing.assert_close(half, expected)
    assert torch.allclose(half.exp().sum(-1), torch.ones(2))
    ids = inputs_for("gpt2")["input_ids"]
    plain = model.generate(ids, max_new_tokens=4, do_sample=False)
    kept = model.generate(
        ids,
        max_new_tokens=4,
        do_sample=False,
        logits_processor=(LogitsProcessorList([BiasScaleLogitsProcessor(model, 1.0)])),
    )
    assert torch.equal(plain, kept)
    with pytest.raises(NaturalBiasError, match="has no natural bias"):
        BiasScaleLogitsProcessor(gpt2(), 0.5)


def test_fractional_counts_are_used_exactly_and_probabilities_refused():
    """Counts are taken as given: a weighted mixture's fractional counts are
    not truncated (2.2.0 made [0.4, 0.3, 2.9] into [0, 0, 2]), and a
    probability vector, which add-one smoothing would swamp, is refused."""
    counts = np.linspace(0.4, 9.7, V)
    model = add_natural_bias(gpt2(), counts=counts)
    expected = np.log((counts + 1) / (counts.sum() + V))
    assert np.allclose(model.natbias_log_prior.numpy(), expected, atol=1e-6)
    with pytest.raises(NaturalBiasError, match="sum to 1: they look like probabilities"):
        add_natural_bias(gpt2(), counts=counts / counts.sum())


def test_lambda_scales_b_as_trained_not_the_prior():
    """With b moved off the prior by a ramp (as training moves it), the
    processor's output is log_softmax(g W phi + lambda b), g W phi computed
    here from the head's input."""
    model = add_natural_bias(gpt2(), zipf_targets()).eval()
    head, ids = model.get_output_embeddings(), inputs_for("gpt2")["input_ids"]
    with torch.no_grad():
        model.output_bias().add_(torch.linspace(-2.0, 2.0, V))
        out = model(input_ids=ids, output_hidden_states=True)
        context = torch.nn.functional.linear(
            out.hidden_states[-1][:, -1] * head.gain(), head.weight
        )
        scores = torch.log_softmax(out.logits[:, -1], -1)
        scaled = BiasScaleLogitsProcessor(model, 0.5)(None, scores)
    assert not torch.allclose(model.output_bias(), model.natbias_log_prior, atol=0.1)
    expected = torch.log_softmax(context + 0.5 * model.output_bias().detach(), -1)
    torch.testing.assert_close(scaled, expected, atol=1e-5, rtol=1e-5)
