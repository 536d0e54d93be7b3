"""Models saved by natbias 1.0.0's transformers extra (tests/fixtures/hf-v1.0.0,
written by its make_fixture.py with the code of 1.0.0) load with today's code
as they were saved: the same class, settings, b, gain and logits, and they
generate. A Trainer checkpoint written by 2.0.0 (tests/fixtures/hf-v2.0.0-trainer)
resumes. Both are format 1, whose gain was 0-d (format 2's is of shape (1,))."""

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM  # noqa: E402

import natbias.hf  # noqa: E402
from natbias import FORMAT_VERSION  # noqa: E402
from natbias.errors import NaturalBiasError  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "hf-v1.0.0"
TRAINER_CHECKPOINT = Path(__file__).parent / "fixtures" / "hf-v2.0.0-trainer"
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


def greedy_continuation(model, prompt, steps):
    """``prompt`` and its ``steps`` likeliest next tokens, each from a whole
    forward (no cache), stopping at EOS, and each step's logits; no step a
    near tie (ACROSS_MACHINES). An encoder-decoder's: ``prompt`` is its
    source, the tokens follow the decoder's start."""
    seq2seq = model.config.is_encoder_decoder
    ids = torch.tensor([[model.config.decoder_start_token_id]]) if seq2seq else prompt
    step_logits = []
    with torch.no_grad():
        for _ in range(steps):
            inputs = (
                dict(input_ids=prompt, decoder_input_ids=ids) if seq2seq else dict(input_ids=ids)
            )
            step_logits.append(model(**inputs).logits[0, -1])
            top = step_logits[-1].topk(2)
            assert (top.values[0] - top.values[1]).item() > ACROSS_MACHINES
            ids = torch.cat([ids, top.indices[:1][None]], 1)
            if top.indices[0].item() == model.config.eos_token_id:
                break
    return ids, step_logits


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_1_0_model_loads_with_its_settings_and_logits(name, expected):
    class_name, auto = CLASSES[name]
    saved = json.loads((FIXTURE / name / "config.json").read_text())
    for model in (natbias.hf.from_pretrained(FIXTURE / name), auto.from_pretrained(FIXTURE / name)):
        assert type(model).__name__ == class_name
        # The saved settings, the format upgraded on load (the gain of shape (1,)).
        upgraded = {**saved["natural_bias"], "format_version": FORMAT_VERSION}
        assert (
            saved["natural_bias"]["format_version"] == 1 and model.config.natural_bias == upgraded
        )
        assert model.get_output_embeddings().gain_param.shape == (1,)
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
        # generate's greedy steps (cached) redone by whole forwards, tokens
        # and logits; an encoder-decoder's last step is forced to EOS
        # (forced_eos_token_id at max_length): one step more, checked apart
        seq2seq = model.config.is_encoder_decoder
        prompt = expected["input_ids"][:1]
        out = model.generate(
            prompt,
            max_new_tokens=3 + seq2seq,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        greedy, step_logits = greedy_continuation(model, prompt, 3)
        assert torch.equal(out.sequences[:, : greedy.shape[1]], greedy)
        for cached, whole in zip(out.logits, step_logits):
            torch.testing.assert_close(cached[0], whole, rtol=0, atol=ACROSS_MACHINES)
        forced = seq2seq and greedy[0, -1].item() != model.config.eos_token_id
        assert out.sequences.shape[1] == greedy.shape[1] + forced
        if forced:
            assert out.sequences[0, -1].item() == model.generation_config.forced_eos_token_id


@pytest.mark.training
def test_a_2_0_trainer_checkpoint_resumes_as_an_uninterrupted_run(tmp_path):
    """Its 0-d gain loads into the (1,) parameter and its 0-d Adam moments are
    reshaped before the first step: updates 3 and 4 as in a run of 4 updates."""
    import hf_scale_worker as worker

    resumed, _ = worker.train(tmp_path / "resumed", 4, 2, resume=str(TRAINER_CHECKPOINT))
    whole, _ = worker.train(tmp_path / "whole", 4, 2)
    logged = [entry[key] for entry in resumed if "loss" in entry for key in ("loss", "gain")]
    expected = [entry[key] for entry in whole if "loss" in entry for key in ("loss", "gain")]
    # The first two logs are 2.0.0's own (the checkpoint's state); then today's resumed updates.
    assert len(logged) == 8 and logged[4:] == pytest.approx(expected[4:], rel=1e-5)


def test_a_format_1_model_asked_for_tensor_parallelism_is_refused_in_one_line():
    """Its 0-d gain cannot be split: it loads on one process, then is saved again."""
    with pytest.raises(NaturalBiasError, match="^a model saved by natbias 2.0 or earlier"):
        natbias.hf.from_pretrained(FIXTURE / "llama", tp_plan="auto")
