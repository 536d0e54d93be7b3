"""Models saved by natbias 1.0.0's transformers extra (tests/fixtures/hf-v1.0.0,
written by its make_fixture.py with the code of 1.0.0) load with today's code
as they were saved: the same class, b, gain and logits, and they generate."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM  # noqa: E402

import natbias.hf  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "hf-v1.0.0"
CLASSES = {
    "marian": ("NaturalBiasMarianMTModel", AutoModelForSeq2SeqLM),
    "bart": ("NaturalBiasBartForConditionalGeneration", AutoModelForSeq2SeqLM),
    "gpt2": ("NaturalBiasGPT2LMHeadModel", AutoModelForCausalLM),
    "llama": ("NaturalBiasLlamaForCausalLM", AutoModelForCausalLM),
}


@pytest.fixture(scope="module")
def expected():
    return load_file(FIXTURE / "expected.safetensors")


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_1_0_model_loads_with_identical_logits(name, expected):
    class_name, auto = CLASSES[name]
    for model in (natbias.hf.from_pretrained(FIXTURE / name), auto.from_pretrained(FIXTURE / name)):
        assert type(model).__name__ == class_name
        assert model.config.natural_bias["format_version"] == 1
        assert model.output_gain().item() == pytest.approx(0.4)
        inputs = {"input_ids": expected["input_ids"]}
        if model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = expected["decoder_input_ids"]
        model.eval()
        with torch.no_grad():
            logits = model(**inputs).logits
        assert torch.equal(logits, expected[name])
        # b was moved away from the prior before saving: both came back.
        assert not torch.equal(model.output_bias().detach(), model.natbias_log_prior)
        assert model.generate(expected["input_ids"][:1], max_new_tokens=3).shape[0] == 1
