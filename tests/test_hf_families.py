"""natbias.hf on fresh tiny models of twenty transformers families: given the
natural bias in place at the default settings, each predicts the smoothed
unigram at update 0, configured as these tests configure it or as a user
first writes it (the family's defaults, special ids included),
reloads through the Auto classes with identical logits, generates, trains
a few updates with the real Trainer, and keeps b, the gain and the prior in
float32 whatever it is cast to. The models that cannot take the bias are
refused in one line."""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_tiny import (  # noqa: E402
    FAMILIES,
    SLOTS,
    V,
    build,
    build_as_written,
    hand_log_prior,
    inputs_for,
    is_seq2seq,
    max_kl_from,
    zipf_targets,
)
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

import natbias.hf  # noqa: E402
from natbias import FORMAT_VERSION  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402
from natbias.hf import add_natural_bias, from_pretrained  # noqa: E402
from natbias.hf.logit_map import map_bias, one_token_inputs  # noqa: E402

ALL = sorted(FAMILIES)
LOGIT_MAPS = {"gemma2": ["softcap"], "cohere": ["scale"]}  # measured by add_natural_bias
FLOAT32 = ("output_bias", "gain_param", "natbias_log_prior")


def natural(family, **settings):
    model = build(family, **settings)
    return add_natural_bias(model, zipf_targets())


def float32_dtypes(model):
    head = model.get_output_embeddings()
    return {
        "output_bias": model.output_bias().dtype,
        "gain_param": head.gain_param.dtype,
        "natbias_log_prior": model.natbias_log_prior.dtype,
    }


@pytest.mark.parametrize("family", ALL)
def test_in_place_the_model_starts_at_the_smoothed_unigram(family):
    stock = build(family)
    before = dict(stock.named_parameters(remove_duplicate=False))
    tied = stock.get_output_embeddings().weight is stock.get_input_embeddings().weight
    head_bias = stock.get_output_embeddings().bias
    model = add_natural_bias(stock, zipf_targets())
    assert model is stock and type(model).__name__ == "NaturalBias" + FAMILIES[family][1]
    # Every parameter is the stock model's own object (a head's own bias,
    # replaced by b, aside); tied embeddings stay tied.
    after = dict(model.named_parameters(remove_duplicate=False))
    for name, parameter in before.items():
        if parameter is not head_bias:
            assert after[name] is parameter, name
    head = model.get_output_embeddings()
    assert (head.weight is model.get_input_embeddings().weight) == tied
    # The prior is the Counter's; b is what makes f(b) the prior (f: the
    # model's map of its head's output, measured, the identity in most).
    prior = hand_log_prior(zipf_targets(), causal=not is_seq2seq(model))
    torch.testing.assert_close(model.natbias_log_prior.double(), prior, rtol=0, atol=1e-6)
    mapped = map_bias(model.output_bias().detach().double(), model.natbias_logit_map)
    torch.testing.assert_close(torch.log_softmax(mapped, -1), prior, rtol=0, atol=2e-5)
    assert list(model.natbias_logit_map or {}) == LOGIT_MAPS.get(family, [])
    assert model.natbias_slot == SLOTS.get(family)
    model.eval()
    with torch.no_grad():
        logits = model(**inputs_for(model)).logits
    assert max_kl_from(prior, logits) < 1e-3  # nats, every position
    assert model.config.natural_bias["format_version"] == FORMAT_VERSION


@pytest.mark.parametrize("family", ALL)
def test_a_configuration_as_a_user_writes_it_starts_at_the_unigram(family):
    """The family's defaults with only the vocabulary and the sizes changed:
    GPT-2, GPT-J and CodeGen keep BOS 50256, Cohere EOS 255001 and Marian
    its decoder start 58100, outside a vocabulary of 40."""
    model = build_as_written(family)
    config = model.config
    ids = [getattr(config, key, None) for key in ("bos_token_id", "decoder_start_token_id")]
    outside = [i for i in ids if isinstance(i, int) and i >= V]
    assert bool(outside) == (family in ("gpt2", "gptj", "codegen", "marian")), ids
    add_natural_bias(model, zipf_targets())
    prior = hand_log_prior(zipf_targets(), causal=not is_seq2seq(model))
    model.eval()
    with torch.no_grad():
        logits = model(**inputs_for(model)).logits
    assert max_kl_from(prior, logits) < 1e-3  # nats, every position


def test_the_probe_takes_the_configurations_ids_inside_the_vocabulary():
    """BOS (and the decoder start) where they are ids of the vocabulary;
    else EOS, padding or 0, the first of them inside it."""
    assert one_token_inputs(build("llama")) == {"input_ids": torch.tensor([[2]])}
    assert one_token_inputs(build_as_written("gpt2")) == {"input_ids": torch.tensor([[0]])}
    assert one_token_inputs(build_as_written("cohere"))["input_ids"].item() == 5  # BOS, not EOS
    assert one_token_inputs(build("gpt2", bos_token_id=99, eos_token_id=7))["input_ids"] == 7
    marian = one_token_inputs(build_as_written("marian"))  # decoder start 58100, pad 0, EOS 0
    assert (marian["input_ids"].item(), marian["decoder_input_ids"].item()) == (0, 0)
    t5 = one_token_inputs(build("t5", decoder_start_token_id=3))  # T5 has no BOS: EOS
    assert (t5["input_ids"].item(), t5["decoder_input_ids"].item()) == (1, 3)


@pytest.mark.parametrize("family", ALL)
def test_a_saved_model_reloads_through_the_auto_classes(family, tmp_path):
    model = natural(family)
    with torch.no_grad():  # as if trained: b and g moved
        model.output_bias().add_(torch.randn(V, generator=torch.Generator().manual_seed(1)) * 0.1)
        model.get_output_embeddings().gain_param.fill_(0.02)
    model.eval().save_pretrained(tmp_path)
    inputs = inputs_for(model)
    auto = AutoModelForSeq2SeqLM if is_seq2seq(model) else AutoModelForCausalLM
    with torch.no_grad():
        expected = model(**inputs).logits
    greedy = dict(max_new_tokens=4, do_sample=False, num_beams=1)
    generated = model.generate(inputs["input_ids"], **greedy)
    for loaded in (auto.from_pretrained(tmp_path), from_pretrained(tmp_path)):
        assert type(loaded) is type(model)
        assert loaded.output_gain().item() == pytest.approx(0.4)
        with torch.no_grad():
            assert torch.equal(loaded(**inputs).logits, expected)
        assert torch.equal(loaded.generate(inputs["input_ids"], **greedy), generated)
    # Loaded in half precision, b, the gain and the prior stay float32, as saved.
    for key in ("dtype", "torch_dtype"):
        half = auto.from_pretrained(tmp_path, **{key: torch.bfloat16})
        assert half.dtype == torch.bfloat16
        assert set(float32_dtypes(half).values()) == {torch.float32}
        assert torch.equal(half.output_bias(), model.output_bias())


@pytest.mark.parametrize("family", ALL)
def test_b_the_gain_and_the_prior_stay_float32_when_the_model_is_cast(family):
    model = natural(family).eval()
    inputs = inputs_for(model)
    captured = {}
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half()):
        cast(model)
        assert set(float32_dtypes(model).values()) == {torch.float32}
        assert model.dtype == next(model.get_input_embeddings().parameters()).dtype != torch.float32
        head = model.get_output_embeddings()
        hook = head.register_forward_hook(lambda m, a, out: captured.update(head=out))
        with torch.no_grad():
            logits = model(**inputs).logits
        hook.remove()
        # Added as the fairseq plugin adds it: b cast to the logits' dtype.
        assert logits.dtype == model.dtype
        if SLOTS.get(family) == "final_logits_bias":
            b = model.output_bias().to(model.dtype)
            assert torch.equal(logits, captured["head"] + b)
        model.float()


@pytest.mark.parametrize("family", ALL)
@pytest.mark.training
def test_the_trainer_trains_it_in_bf16(family, tmp_path):
    model = natural(family)
    data = [{"input_ids": t[::-1], "labels": t} for t in zipf_targets(32)]
    if not is_seq2seq(model):
        data = [{"input_ids": t, "labels": t} for t in zipf_targets(32)]
    b0 = model.output_bias().detach().clone()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=16,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        save_strategy="no",
        bf16=True,
    )
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data, data_collator=_collate)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert set(float32_dtypes(model).values()) == {torch.float32}
    assert not torch.equal(model.output_bias().detach(), b0)  # b trained
    if not is_seq2seq(model):  # the Trainer shifts its labels, as the stock class's
        assert type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def _collate(features):
    def pad(key, value):
        width = max(len(f[key]) for f in features)
        return torch.tensor([f[key] + [value] * (width - len(f[key])) for f in features])

    ids = pad("input_ids", 0)
    return {"input_ids": ids, "attention_mask": ids.ne(0).long(), "labels": pad("labels", -100)}


def test_a_fresh_process_loads_any_family_through_the_auto_classes(tmp_path):
    """natbias-qwen2 is made when transformers first looks it up, after
    import natbias.hf; before it, transformers refuses the unknown type."""
    import subprocess
    import sys

    natural("qwen2").save_pretrained(tmp_path)
    code = (
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        f"    AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "except ValueError as error:\n"
        "    assert 'natbias-qwen2' in str(error), error\n"
        "else:\n"
        "    raise SystemExit('loaded without natbias.hf')\n"
        "import natbias.hf\n"
        f"model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "print(type(model).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["NaturalBiasQwen2ForCausalLM"]


def test_models_that_cannot_take_the_bias_are_refused_in_one_line():
    cases = [
        (build("t5").encoder, "has no output layer|not a transformers PreTrainedModel"),
        (transformers.T5EncoderModel(build("t5").config), "has no output layer"),
        (
            transformers.BertForMaskedLM(
                transformers.BertConfig(
                    vocab_size=V,
                    hidden_size=16,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=32,
                )
            ),
            "BertForMaskedLM is not a generator",
        ),
    ]
    nonlinear = build("gpt2")
    nonlinear.lm_head = nn.Sequential(nn.Linear(16, V), nn.Tanh())
    cases.append((nonlinear, "output layer is a Sequential, not a linear map"))
    capped = build("gemma2", final_logit_softcapping=2.0)
    cases.append((capped, "soft-caps its logits at ±2, and the log prior spans"))
    for model, message in cases:
        with pytest.raises(NaturalBiasError, match=message) as error:
            add_natural_bias(model, zipf_targets())
        assert "\n" not in str(error.value)


def test_a_map_it_cannot_invert_is_refused_and_the_model_left_as_it_was():
    model = build("gpt2").eval()
    inputs = inputs_for(model)
    with torch.no_grad():
        before = model(**inputs).logits
    cubed = model.register_forward_hook(lambda m, a, out: out.__class__(logits=out.logits**3))
    with pytest.raises(NaturalBiasError, match="cannot invert"):
        add_natural_bias(model, zipf_targets())
    cubed.remove()
    assert type(model) is transformers.GPT2LMHeadModel
    assert type(model.config) is transformers.GPT2Config
    assert type(model.get_output_embeddings()) is nn.Linear
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


def test_the_model_it_gives_up_on_after_changing_it_is_put_back(monkeypatch):
    """A failure after the model changed class (here: the check that it
    starts at the prior) leaves the stock model as it was."""
    model = build("marian")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(
        natbias.hf.natural_bias,
        "check_starts_at_prior",
        lambda *a: (_ for _ in ()).throw(NaturalBiasError("no")),
    )
    with pytest.raises(NaturalBiasError, match="no"):
        add_natural_bias(model, zipf_targets())
    assert type(model) is transformers.MarianMTModel and "natural_bias" not in vars(model.config)
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
