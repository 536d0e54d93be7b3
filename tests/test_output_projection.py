"""Output bias and weight initialisation schemes."""

import math

import pytest
import torch
from torch import nn

from fairseq_natbias import output_projection


class FakeDecoder(nn.Module):
    """Just the attributes output_projection touches."""

    def __init__(self, vocab=50, dim=16, tied=False, final_norm=True):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.output_projection = nn.Linear(dim, vocab, bias=False)
        self.share_input_output_embed = tied
        if tied:
            self.output_projection.weight = self.embed_tokens.weight
        self.layer_norm = nn.LayerNorm(dim) if final_norm else None
        self.layers = []


def test_attach_bias_adds_a_trainable_or_frozen_parameter():
    decoder = FakeDecoder()
    values = torch.linspace(-5, -1, 50)
    output_projection.attach_output_bias(decoder, values)
    assert torch.equal(decoder.output_projection.bias.data, values)
    assert "output_projection.bias" in dict(decoder.named_parameters())
    features = torch.randn(3, 16)
    expected = features @ decoder.output_projection.weight.T + values
    assert torch.allclose(decoder.output_projection(features), expected, atol=1e-6)

    frozen = FakeDecoder()
    output_projection.attach_output_bias(frozen, values, freeze=True)
    assert not frozen.output_projection.bias.requires_grad

    none = FakeDecoder()
    output_projection.attach_output_bias(none, None)
    assert none.output_projection.bias is None


def test_damped_init_scales_the_feature_norm_gain():
    decoder = FakeDecoder(tied=True)
    weight_before = decoder.output_projection.weight.detach().clone()
    output_projection.init_output_weights(decoder, "damped", None, feature_gain=0.1)
    assert torch.allclose(decoder.layer_norm.weight, torch.full((16,), 0.1))
    assert torch.equal(decoder.output_projection.weight, weight_before)  # W untouched
    features = decoder.layer_norm(torch.randn(4, 16))
    assert features.norm(dim=-1).max() < 0.1 * math.sqrt(16) + 1e-4


@pytest.mark.parametrize("tied", [False, True])
def test_paper_init_matches_the_reference_norm(tied):
    decoder = FakeDecoder(tied=tied)
    output_projection.init_output_weights(decoder, "paper", 123.0, feature_gain=0.1)
    assert math.isclose(decoder.output_projection.weight.norm().item(), 123.0, rel_tol=1e-5)
    if tied:  # the shared embedding is the same tensor
        assert decoder.embed_tokens.weight.data_ptr() == decoder.output_projection.weight.data_ptr()


def test_fairseq_init_changes_nothing():
    decoder = FakeDecoder()
    state = {k: v.clone() for k, v in decoder.state_dict().items()}
    output_projection.init_output_weights(decoder, "fairseq", 10.0, feature_gain=0.1)
    assert all(torch.equal(state[k], v) for k, v in decoder.state_dict().items())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="natbias-feature-gain"):
        output_projection.init_output_weights(FakeDecoder(), "damped", None, 0.0)
    with pytest.raises(ValueError, match="natbias-weight-init"):
        output_projection.init_output_weights(FakeDecoder(), "other", None, 0.1)
    with pytest.raises(ValueError, match="final layer norm"):
        decoder = FakeDecoder(tied=True, final_norm=False)
        output_projection.init_output_weights(decoder, "damped", None, 0.1)


# --- the gain (weight init ``gain``, the default) --------------------------------


def test_gained_projection_is_g_w_phi_plus_b_and_keeps_the_tie():
    decoder = FakeDecoder(tied=True)
    values = torch.linspace(-5, -1, 50)
    output_projection.attach_output_bias(decoder, values)
    gained = output_projection.add_output_gain(decoder, gain_init=0.05, speed=20.0)
    assert decoder.output_projection is gained
    assert gained.weight is decoder.embed_tokens.weight  # still tied
    assert gained.bias is not None and torch.equal(gained.bias, values)
    assert gained.gain_param.item() == pytest.approx(0.05 / 20.0)
    features = torch.randn(3, 16)
    expected = 0.05 * (features @ decoder.embed_tokens.weight.T) + values
    torch.testing.assert_close(gained(features), expected, atol=1e-6, rtol=1e-6)
    assert set(dict(decoder.named_parameters())) == {
        "embed_tokens.weight", "output_projection.bias", "output_projection.gain_param",
        "layer_norm.weight", "layer_norm.bias"}
    assert output_projection.output_gain(decoder).item() == pytest.approx(0.05)
    norm = decoder.embed_tokens.weight.detach().norm().item()
    assert output_projection.contextual_weight_norm(decoder) == pytest.approx(0.05 * norm, rel=1e-6)


def test_adding_the_gain_draws_no_random_numbers():
    torch.manual_seed(0)
    decoder = FakeDecoder()
    output_projection.add_output_gain(decoder, 0.05, 20.0)
    after = torch.rand(1)
    torch.manual_seed(0)
    FakeDecoder()
    assert torch.equal(after, torch.rand(1))


def test_one_adam_update_moves_the_gain_by_speed_times_lr():
    """The documented speed: Adam's first step on u is lr * sign(grad) (its
    bias-corrected m / sqrt(v) is grad / |grad|), so g = speed * u moves by
    exactly speed * lr, whatever the gradient's size; a plain scalar gain
    (speed 1) would move by lr."""
    lr = 1e-3
    for speed in (1.0, 20.0, 50.0):
        torch.manual_seed(0)
        decoder = FakeDecoder()
        gained = output_projection.add_output_gain(decoder, 0.05, speed)
        optimizer = torch.optim.Adam([gained.gain_param], lr=lr, betas=(0.9, 0.997), eps=1e-8)
        features = torch.randn(8, 16)
        targets = torch.randint(0, 50, (8,))
        loss = torch.nn.functional.cross_entropy(gained(features), targets)
        loss.backward()
        grad_sign = torch.sign(gained.gain_param.grad).item()
        optimizer.step()
        moved = output_projection.output_gain(decoder).item() - 0.05
        assert moved == pytest.approx(-grad_sign * speed * lr, rel=1e-4)


@pytest.mark.parametrize("option, value", [("gain_init", 0.0), ("gain_init", float("nan")),
                                           ("speed", -1.0)])
def test_bad_gain_settings_are_refused(option, value):
    settings = {"gain_init": 0.05, "speed": 20.0, option: value}
    with pytest.raises(ValueError, match="natbias-gain"):
        output_projection.add_output_gain(FakeDecoder(), **settings)
