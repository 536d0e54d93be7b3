"""The gain's start where the caller gives none (natbias.hf.gain_start):
0.05, lowered where the measured W phi is large (T5's), measured here
independently from the model's own hidden states; given, it is used as it
is; a model on the meta device, where nothing can be measured, starts at 0.05."""

import math

import pytest
import torch

pytest.importorskip("transformers")

from hf_tiny import build, hand_log_prior, max_kl_from, zipf_targets  # noqa: E402

import natbias.hf.natural_bias  # noqa: E402
from natbias.head import DEFAULT_GAIN_INIT  # noqa: E402
from natbias.hf import add_natural_bias  # noqa: E402
from natbias.hf.gain_start import START_KL, contextual_scale, initial_gain  # noqa: E402
from natbias.hf.logit_map import one_token_inputs  # noqa: E402


def t5_scale_by_hand(model):
    """The standard deviation of W phi on the probe, from the decoder's last
    hidden state (after its final norm), which T5 scales by d^-0.5 before
    its tied head."""
    with torch.no_grad():
        out = model.eval()(**one_token_inputs(model), output_hidden_states=True)
    phi = out.decoder_hidden_states[-1][0, -1].double() * model.config.d_model**-0.5
    return (model.lm_head.weight.double() @ phi).std().item()


def test_t5_starts_lower_than_the_default_as_its_w_phi_is_larger():
    model = build("t5")
    scale = t5_scale_by_hand(model)
    assert scale > 10 * contextual_scale(build("gpt2"))  # N(0, 1) embeddings, not N(0, 0.02²)
    expected = math.sqrt(2 * START_KL) / scale
    add_natural_bias(model, zipf_targets())
    assert model.config.natural_bias["gain_init"] == pytest.approx(expected, rel=5e-3)
    assert model.output_gain().item() == pytest.approx(expected, rel=5e-3)
    assert model.output_gain().item() < DEFAULT_GAIN_INIT


def test_a_model_whose_w_phi_is_small_starts_at_the_default():
    model = add_natural_bias(build("gpt2"), zipf_targets())
    assert model.config.natural_bias["gain_init"] == DEFAULT_GAIN_INIT
    assert model.output_gain().item() == pytest.approx(DEFAULT_GAIN_INIT)


def test_a_given_start_is_used_as_it_is_and_nothing_is_measured(monkeypatch):
    def measured(*args):
        raise AssertionError("measured although gain_init was given")

    monkeypatch.setattr(natbias.hf.natural_bias, "contextual_scale", measured)
    model = add_natural_bias(build("t5"), zipf_targets(), gain_init=0.03)
    assert model.config.natural_bias["gain_init"] == 0.03
    assert model.output_gain().item() == pytest.approx(0.03)


def test_the_start_from_a_scale_and_without_one():
    assert initial_gain(None) == initial_gain(0.0) == DEFAULT_GAIN_INIT
    assert initial_gain(0.01) == DEFAULT_GAIN_INIT  # never above the default
    # Three significant digits, as the configuration records it.
    assert initial_gain(1.0) == pytest.approx(math.sqrt(2e-4), rel=5e-3)
    assert initial_gain(10.0) == pytest.approx(math.sqrt(2e-4) / 10, rel=5e-3)


def test_a_model_on_the_meta_device_is_not_measured():
    with torch.device("meta"):
        model = build("t5")
    assert model.lm_head.weight.is_meta
    assert contextual_scale(model) is None
    assert initial_gain(contextual_scale(model)) == DEFAULT_GAIN_INIT


def test_a_logit_scale_scales_what_the_logits_see():
    model = build("cohere")
    assert contextual_scale(model, {"scale": 0.0625}) == pytest.approx(
        0.0625 * contextual_scale(model), rel=1e-12
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w_phi_block_by_block_is_the_float64_product_of_a_copy(dtype):
    """W phi a block of rows at a time (no copy of W) against the float64
    product of a whole copy, as computed before: equal to 1e-12 relative
    (float64 rounding, the sums' order); over several blocks and a partial last one."""
    from natbias.hf.gain_start import BLOCK_ELEMENTS, contextual_logits

    torch.manual_seed(0)
    d = 200
    weight = torch.randn(2 * BLOCK_ELEMENTS // d + 77, d).to(dtype)
    phi = torch.randn(d).to(dtype)
    before = torch.nn.functional.linear(phi.double(), weight.double())
    ours = contextual_logits(weight, phi)
    assert ours.dtype == torch.float64 and ours.shape == before.shape
    torch.testing.assert_close(ours, before, rtol=1e-12, atol=1e-12)
    assert ours.std().item() == pytest.approx(before.std().item(), rel=1e-12)


def last_position_scale_by_hand(model):
    """The standard deviation of W phi on the probe, from the last hidden
    state (after the final norm) at its last position."""
    with torch.no_grad():
        out = model.eval()(**one_token_inputs(model), output_hidden_states=True)
    phi = out.hidden_states[-1][0, -1].double()
    return (model.get_output_embeddings().weight.double() @ phi).std().item()


# d = 1024 in one block (the start depends on d through W phi's scale, not on depth)
WIDE = {
    "gpt2": dict(n_embd=1024, n_head=16, n_layer=1),
    "llama": dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=16,
                  intermediate_size=64, num_hidden_layers=1),
}  # fmt: skip


@pytest.mark.parametrize("family", WIDE)
def test_at_d_1024_the_measured_start_is_below_the_default_and_starts_at_the_unigram(family):
    """W from N(0, 0.02²) and phi layer-normalised: W phi's scale grows as
    sqrt(d), so at d = 1024 the start the measurement picks is below 0.05
    (the families' tests, at d = 16, stay at 0.05). It is sqrt(2 START_KL) / s
    for s measured here from the hidden states, and the fresh model's bits on
    held-out targets are the unigram's counted here (0.05 bits), its KL from
    the prior at every position below 10 START_KL."""
    model = build(family, **WIDE[family])
    expected = math.sqrt(2 * START_KL) / last_position_scale_by_hand(model)
    assert expected < DEFAULT_GAIN_INIT
    add_natural_bias(model, zipf_targets())
    assert model.config.natural_bias["gain_init"] == pytest.approx(expected, rel=5e-3)
    assert model.output_gain().item() == pytest.approx(expected, rel=5e-3)
    prior = hand_log_prior(zipf_targets(), causal=True)
    held_out = torch.tensor([s[:4] for s in zipf_targets(50, seed=1) if len(s) >= 4])
    with torch.no_grad():
        logits = model.eval()(input_ids=held_out).logits
    log_p = torch.log_softmax(logits[:, :-1].double(), -1)
    targets = held_out[:, 1:, None]
    bits = -log_p.gather(-1, targets).mean().item() / math.log(2)
    unigram_bits = -prior[targets].mean().item() / math.log(2)
    assert abs(bits - unigram_bits) < 0.05, (bits, unigram_bits)
    assert max_kl_from(prior, logits) < 10 * START_KL
