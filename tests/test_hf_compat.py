"""Models saved by natbias 1.0.0's transformers extra (tests/fixtures/hf-v1.0.0,
written by its make_fixture.py with the code of 1.0.0) load with today's code
as they were saved: the same class, settings, b, gain and logits, and they
generate."""

import json
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
# The stored logits were computed on the fixture maker's machine. Another
# CPU's vector kernels (ATEN_CPU_CAPABILITY default, avx2, avx512, another
# BLAS) sum in another order and round differently: measured up to 2.4e-7
# apart, one or two float32 spacings at the logits' size (|logit| <= 6, where
# the spacing is 4.8e-7). 1e-4 leaves 200 spacings for deeper differences and
# is still 500 times below what a loading fault changes: b was moved by noise
# of 0.1 and the gain set to 0.4 before saving, and b left at the prior or
# the gain at a fresh model's 0.05 moves these logits by 0.17 or 0.05 at least.
ACROSS_MACHINES = 1e-4


@pytest.fixture(scope="module")
def expected():
    return load_file(FIXTURE / "expected.safetensors")


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_1_0_model_loads_with_its_settings_and_logits(name, expected):
    class_name, auto = CLASSES[name]
    saved = json.loads((FIXTURE / name / "config.json").read_text())
    for model in (natbias.hf.from_pretrained(FIXTURE / name), auto.from_pretrained(FIXTURE / name)):
        assert type(model).__name__ == class_name
        assert model.config.natural_bias == saved["natural_bias"]
        assert model.config.natural_bias["format_version"] == 1
        assert model.output_gain().item() == pytest.approx(0.4)
        inputs = {"input_ids": expected["input_ids"]}
        if model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = expected["decoder_input_ids"]
        model.eval()
        with torch.no_grad():
            logits = model(**inputs).logits
        torch.testing.assert_close(logits, expected[name], rtol=0, atol=ACROSS_MACHINES)
        # b was moved away from the prior before saving: both came back.
        assert not torch.equal(model.output_bias().detach(), model.natbias_log_prior)
        assert model.generate(expected["input_ids"][:1], max_new_tokens=3).shape[0] == 1
