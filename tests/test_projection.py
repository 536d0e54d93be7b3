"""The output layer ``W (g phi) + b`` (natbias.projection): the bias, the gain
on W phi, the paper's weight init, half precision. No fairseq."""

import math

import pytest
import torch
from torch import nn

from natbias.errors import NaturalBiasError
from natbias.projection import NaturalBiasProjection, _ScaleByGain, paper_weight_init_
from natbias.statistics import Statistics


class FakeDecoder(nn.Module):
    """A decoder's embeddings and output layer, tied or not."""

    def __init__(self, vocab=50, dim=16, tied=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.output_projection = nn.Linear(dim, vocab, bias=False)
        self.share_input_output_embed = tied
        if tied:
            self.output_projection.weight = self.embed_tokens.weight
        self.layer_norm = nn.LayerNorm(dim)


def with_bias(decoder, values):
    """The decoder's output layer with bias ``values`` and no gain."""
    decoder.output_projection = NaturalBiasProjection(decoder.output_projection.weight, values)
    return decoder.output_projection


def add_gain(decoder, gain_init=0.05, speed=20.0):
    """The decoder's output layer with the gain, keeping its bias."""
    old = decoder.output_projection
    decoder.output_projection = NaturalBiasProjection(
        old.weight, None if old.bias is None else old.bias.detach(), gain_init, speed
    )
    return decoder.output_projection


def test_the_bias_is_a_float32_parameter_and_w_is_the_decoders_own():
    decoder = FakeDecoder()
    weight = decoder.output_projection.weight
    values = torch.linspace(-5, -1, 50)
    projection = with_bias(decoder, values)
    assert projection.weight is weight
    assert torch.equal(projection.bias.data, values)
    assert "output_projection.bias" in dict(decoder.named_parameters())
    features = torch.randn(3, 16)
    expected = features @ weight.T + values
    assert torch.allclose(projection(features), expected, atol=1e-6)
    assert NaturalBiasProjection(weight, None).bias is None
    with pytest.raises(
        NaturalBiasError, match="the bias has \\(49,\\) entries, the output layer 50"
    ):
        NaturalBiasProjection(weight, torch.zeros(49))


@pytest.mark.parametrize("tied", [False, True])
def test_paper_init_matches_the_reference_norm(tied):
    decoder = FakeDecoder(tied=tied)
    paper_weight_init_(decoder.output_projection.weight, 123.0)
    weight = decoder.output_projection.weight
    assert math.isclose(weight.norm().item(), 123.0, rel_tol=1e-5)
    if tied:  # the shared embedding is the same tensor
        assert decoder.embed_tokens.weight.data_ptr() == weight.data_ptr()
    with pytest.raises(NaturalBiasError, match="norm of the log prior"):
        paper_weight_init_(weight, 0.0)


# --- the gain (weight init ``gain``, the default) --------------------------------


def test_gained_projection_is_g_w_phi_plus_b_and_keeps_the_tie():
    decoder = FakeDecoder(tied=True)
    values = torch.linspace(-5, -1, 50)
    with_bias(decoder, values)
    gained = add_gain(decoder, gain_init=0.05, speed=20.0)
    assert decoder.output_projection is gained
    assert gained.weight is decoder.embed_tokens.weight  # still tied
    assert gained.bias is not None and torch.equal(gained.bias, values)
    assert gained.gain_param.item() == pytest.approx(0.05 / 20.0)  # g = C u
    assert gained.gain_param.dtype == torch.float32
    features = torch.randn(3, 16)
    expected = 0.05 * (features @ decoder.embed_tokens.weight.T) + values
    torch.testing.assert_close(gained(features), expected, atol=1e-6, rtol=1e-6)
    assert set(dict(decoder.named_parameters())) == {
        "embed_tokens.weight",
        "output_projection.bias",
        "output_projection.gain_param",
        "layer_norm.weight",
        "layer_norm.bias",
    }
    assert gained.gain().item() == pytest.approx(0.05)
    norm = decoder.embed_tokens.weight.detach().norm().item()
    stats = Statistics()
    stats.add_head(gained.bias, values, gained.weight, gained.gain())
    assert stats.values["weight_norm"] == pytest.approx(0.05 * norm, rel=1e-6)


def test_adding_the_gain_draws_no_random_numbers():
    torch.manual_seed(0)
    decoder = FakeDecoder()
    add_gain(decoder, 0.05, 20.0)
    after = torch.rand(1)
    torch.manual_seed(0)
    FakeDecoder()
    assert torch.equal(after, torch.rand(1))


def _one_adam_update(speed, lr=1e-3):
    torch.manual_seed(0)
    decoder = FakeDecoder()
    gained = add_gain(decoder, 0.05, speed)
    optimizer = torch.optim.Adam([gained.gain_param], lr=lr, betas=(0.9, 0.997), eps=1e-8)
    features = torch.randn(8, 16)
    targets = torch.randint(0, 50, (8,))
    torch.nn.functional.cross_entropy(gained(features), targets).backward()
    grad_sign = torch.sign(gained.gain_param.grad).item()
    optimizer.step()
    return gained.gain().item(), grad_sign


@pytest.mark.parametrize("speed", [1.0, 20.0, 50.0])
def test_one_adam_update_moves_the_gain_by_speed_times_lr(speed):
    """The documented speed: Adam's first step on u is lr * sign(grad) (its
    bias-corrected m / sqrt(v) is grad / |grad|), whatever the gradient's
    size, so g = |C u| moves by C * lr (below the cap)."""
    lr = 1e-3
    gain, sign = _one_adam_update(speed, lr)
    assert gain - 0.05 == pytest.approx(-sign * speed * lr, rel=1e-4)


def gain_of(u, speed):
    """g = min(|C u|, 1), written out again."""
    return torch.clamp((u * speed).abs(), max=1.0)


def _true_gain_gradient(gained, features, targets):
    """d loss / d u by plain autograd through g(u) and W (g phi) + b, with
    none of the projection's own backward."""
    u = gained.gain_param.detach().clone().requires_grad_()
    gain = gain_of(u, gained.gain_speed)
    logits = torch.nn.functional.linear(features * gain, gained.weight, gained.bias)
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    return u.grad


@pytest.mark.parametrize("u", [0.0025, 0.07, -0.01])  # below the cap, above it, below zero
def test_the_gain_gradient_is_the_true_one_divided_by_speed_times_width(u):
    """What the optimiser sees for u: dL/du / (C d), d the feature width
    (see _ScaleByGain for why); every other gradient untouched."""
    torch.manual_seed(0)
    decoder = FakeDecoder()
    with_bias(decoder, torch.linspace(-5, -1, 50))
    gained = add_gain(decoder, 0.05, 20.0)
    with torch.no_grad():
        gained.gain_param.fill_(u)
    features = torch.randn(32, 16, requires_grad=True)
    targets = torch.randint(0, 50, (32,))
    torch.nn.functional.cross_entropy(gained(features), targets, reduction="sum").backward()
    true = _true_gain_gradient(gained, features.detach(), targets)
    torch.testing.assert_close(gained.gain_param.grad, true / (20.0 * 16), rtol=1e-5, atol=0)
    plain = features.detach().clone().requires_grad_()
    logits = torch.nn.functional.linear(
        plain * gain_of(torch.tensor(u), 20.0), gained.weight, gained.bias
    )
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    torch.testing.assert_close(features.grad, plain.grad, rtol=1e-5, atol=1e-7)


def test_adam_moves_the_gain_as_with_the_true_gradient():
    """Adam is invariant to a constant scale of a parameter's gradient: ten
    updates with the divided gradient give the u of ten with the true one."""
    torch.manual_seed(0)
    decoder = FakeDecoder()
    gained = add_gain(decoder, 0.05, 20.0)
    start = gained.gain_param.item()
    batches = [(torch.randn(16, 16), torch.randint(0, 50, (16,))) for _ in range(10)]
    ours = torch.optim.Adam([gained.gain_param], lr=1e-2, betas=(0.9, 0.98))
    reference_u = gained.gain_param.detach().clone().requires_grad_()
    reference = torch.optim.Adam([reference_u], lr=1e-2, betas=(0.9, 0.98))
    for features, targets in batches:
        ours.zero_grad()
        torch.nn.functional.cross_entropy(gained(features), targets, reduction="sum").backward()
        ours.step()
        reference.zero_grad()
        gain = gain_of(reference_u, 20.0)
        logits = torch.nn.functional.linear(features * gain, gained.weight)
        torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
        reference.step()
    assert gained.gain_param.item() != pytest.approx(start, abs=1e-3)  # it moved
    assert gained.gain_param.item() == pytest.approx(reference_u.item(), rel=1e-5)


def test_the_gain_gradient_is_reduced_in_float32_under_fp16():
    """A (tokens x d) sum of fp16 products overflows 65,504 (4096 tokens x
    512 features x 2 here, as a loss-scaled fp16 backward meets it), the same
    sum in float32 does not."""
    features = torch.ones(4096, 512, dtype=torch.float16)
    gain = torch.tensor(0.05, requires_grad=True)
    upstream = torch.full((4096, 512), 2.0, dtype=torch.float16)
    naive = gain.detach().clone().requires_grad_()
    (features * naive.to(torch.float16)).backward(upstream)
    assert not torch.isfinite(naive.grad)  # what 0.2.0's gain met
    scaled = _ScaleByGain.apply(features, gain, 1.0)
    scaled.backward(upstream)
    assert scaled.dtype == torch.float16
    assert gain.grad.item() == 2.0 * 4096 * 512


def test_a_half_model_keeps_bias_and_gain_in_float32():
    decoder = FakeDecoder(dim=16)
    values = torch.linspace(-20, -1, 50)
    with_bias(decoder, values)
    gained = add_gain(decoder, 0.05, 20.0)
    decoder.half()
    assert gained.weight.dtype == torch.float16
    assert gained.bias.dtype == gained.gain_param.dtype == torch.float32
    assert torch.equal(gained.bias, values)  # not rounded to fp16 and back
    features = torch.randn(4, 16).half()
    logits = gained(features)
    assert logits.dtype == torch.float16
    expected = (0.05 * features.float()) @ gained.weight.float().T + values
    torch.testing.assert_close(logits.float(), expected, atol=2e-2, rtol=1e-2)
    decoder.float()
    assert gained.weight.dtype == torch.float32 and torch.equal(gained.bias, values)


def test_the_gain_stays_positive_where_adam_pushes_it_through_zero():
    """Adam pushed down for 500 updates at C = 100, lr 1e-3: C u crosses 0
    after half an update's worth; g = |C u| turns back up instead of
    changing sign."""
    gained = add_gain(FakeDecoder(), 0.05, 100.0)
    optimizer = torch.optim.Adam([gained.gain_param], lr=1e-3)
    us, gains = [], []
    for _ in range(500):
        optimizer.zero_grad()
        gained.gain().backward()  # Adam lowers g
        optimizer.step()
        us.append(gained.gain_param.item())
        gains.append(gained.gain().item())
    assert min(us) < 0  # C u went through zero
    assert min(gains) >= 0  # g did not


def test_the_capped_gain_rises_by_speed_times_lr_then_holds_at_one():
    """Hand-worked: a loss that only ever asks for a larger g (-g), Adam at
    lr 1e-3, C = 20. A constant gradient makes every Adam step exactly lr
    (bias-corrected m / sqrt(v) = 1), so g = 0.05 + 0.02 k after k updates:
    0.25 after 10, 0.99 after 47; the 48th would reach 1.01 and is capped
    at 1. There u's gradient is 0, and the projection is W phi + b exactly:
    the paper's model."""
    decoder = FakeDecoder()
    values = torch.linspace(-5, -1, 50)
    with_bias(decoder, values)
    gained = add_gain(decoder, 0.05, 20.0)
    optimizer = torch.optim.Adam([gained.gain_param], lr=1e-3)
    gains = []
    for _ in range(60):
        optimizer.zero_grad()
        (-gained.gain()).backward()
        optimizer.step()
        gains.append(gained.gain().item())
    assert gains[9] == pytest.approx(0.25, abs=1e-5)
    assert gains[46] == pytest.approx(0.99, abs=1e-4)
    assert gains[47:] == [1.0] * 13
    optimizer.zero_grad()
    features = torch.randn(3, 16, requires_grad=True)
    gained(features).sum().backward()
    assert gained.gain_param.grad.item() == 0.0
    expected = features.detach() @ gained.weight.T + values
    torch.testing.assert_close(gained(features.detach()), expected, atol=1e-6, rtol=1e-6)


def test_the_capped_gain_at_its_cap_under_fp16_loss_scaling():
    """As fairseq's --fp16 drives it: a half model, the summed loss times
    fp16's starting loss scale (2^7), the backward in half precision. At the
    cap u gets a gradient of exactly 0, and the features and W get the
    gradients of stock fairseq's projection with a bias (a plain fp16
    ``F.linear``): the model is W phi + b, overflowing where stock would."""
    torch.manual_seed(0)
    decoder = FakeDecoder(dim=16)
    with_bias(decoder, torch.linspace(-12, -1, 50))
    gained = add_gain(decoder, 0.05, 20.0)
    with torch.no_grad():
        gained.gain_param.fill_(0.06)  # C u = 1.2: capped
    decoder.half()
    targets = torch.randint(0, 50, (64,))
    features = torch.randn(64, 16).half()
    ours = features.clone().requires_grad_()
    logits = gained(ours)
    (
        torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum") * 2.0**7
    ).backward()
    stock = features.clone().requires_grad_()
    weight = gained.weight.detach().clone().requires_grad_()
    plain = torch.nn.functional.linear(stock, weight, gained.bias.detach().half())
    (torch.nn.functional.cross_entropy(plain.float(), targets, reduction="sum") * 2.0**7).backward()
    assert logits.dtype == torch.float16 and torch.equal(logits, plain)
    assert gained.gain_param.grad.item() == 0.0
    assert torch.isfinite(ours.grad).all() and torch.isfinite(gained.weight.grad).all()
    assert torch.equal(ours.grad, stock.grad) and torch.equal(gained.weight.grad, weight.grad)
    assert gained.bias.grad.dtype == torch.float32 and torch.isfinite(gained.bias.grad).all()


def test_the_gain_refuses_to_start_at_its_cap():
    with pytest.raises(NaturalBiasError, match="gain init 1 is not below the gain's cap of 1"):
        add_gain(FakeDecoder(), 1.0, 20.0)


@pytest.mark.parametrize(
    "option, value", [("gain_init", 0.0), ("gain_init", float("nan")), ("speed", -1.0)]
)
def test_bad_gain_settings_are_refused(option, value):
    settings = {"gain_init": 0.05, "speed": 20.0, option: value}
    with pytest.raises(NaturalBiasError, match="gain (init|speed) must be a finite number > 0"):
        add_gain(FakeDecoder(), **settings)


def test_reset_parameters_sets_b_and_the_gain_to_their_start_and_leaves_w():
    """What a model built on the meta device runs once materialised."""
    decoder = FakeDecoder(tied=True)
    values = torch.linspace(-5, -1, 50)
    with_bias(decoder, values)
    gained = add_gain(decoder, gain_init=0.05, speed=20.0)
    weight = gained.weight.detach().clone()
    with torch.no_grad():
        gained.bias.add_(1.0)
        gained.gain_param.fill_(0.03)
    gained.reset_parameters()
    assert torch.equal(gained.bias.data, values)
    assert gained.gain().item() == pytest.approx(0.05) and gained.gain_param.shape == (1,)
    assert torch.equal(gained.weight, weight)


def test_a_format_1_state_dict_with_a_0_d_gain_loads():
    decoder = FakeDecoder()
    with_bias(decoder, torch.zeros(50))
    gained = add_gain(decoder)
    state = {k: v.clone() for k, v in gained.state_dict().items()}
    state["gain_param"] = torch.tensor(0.015)  # natbias <= 2.0 saved u 0-d
    gained.load_state_dict(state)
    assert gained.gain_param.shape == (1,) and gained.gain().item() == pytest.approx(0.3)


def test_on_the_meta_device_the_values_wait_for_reset_parameters():
    with torch.device("meta"):
        decoder = FakeDecoder()
    values = torch.linspace(-5, -1, 50)
    projection = NaturalBiasProjection(decoder.output_projection.weight, values, 0.05, 20.0)
    assert projection.bias.is_meta
    projection.to_empty(device="cpu")
    assert projection.bias.dtype == torch.float32 and not projection.bias.is_meta
    with pytest.raises(NaturalBiasError, match="after to_empty, call model.init_weights"):
        projection(torch.randn(2, 16))
    projection.reset_parameters()
    assert torch.equal(projection.bias.data, values) and projection.gain().item() == pytest.approx(
        0.05
    )
    assert projection(torch.randn(2, 16)).shape == (2, 50)
