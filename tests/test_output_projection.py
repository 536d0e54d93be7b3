"""Output bias and weight initialisation schemes."""

import math

import pytest
import torch
from torch import nn

from fairseq_natbias import output_projection


class FakeDecoder(nn.Module):
    """Just the attributes output_projection touches."""

    def __init__(self, vocab=50, dim=16, tied=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.output_projection = nn.Linear(dim, vocab, bias=False)
        self.share_input_output_embed = tied
        if tied:
            self.output_projection.weight = self.embed_tokens.weight
        self.layer_norm = nn.LayerNorm(dim)


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


@pytest.mark.parametrize("tied", [False, True])
def test_paper_init_matches_the_reference_norm(tied):
    decoder = FakeDecoder(tied=tied)
    output_projection.init_output_weights(decoder, "paper", 123.0)
    assert math.isclose(decoder.output_projection.weight.norm().item(), 123.0, rel_tol=1e-5)
    if tied:  # the shared embedding is the same tensor
        assert decoder.embed_tokens.weight.data_ptr() == decoder.output_projection.weight.data_ptr()


def test_fairseq_init_changes_nothing():
    decoder = FakeDecoder()
    state = {k: v.clone() for k, v in decoder.state_dict().items()}
    output_projection.init_output_weights(decoder, "fairseq", 10.0)
    assert all(torch.equal(state[k], v) for k, v in decoder.state_dict().items())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="natbias-weight-init 'other' for a new model: "
                                         "choose one of gain, fairseq, paper$"):
        output_projection.init_output_weights(FakeDecoder(), "other", None)


def test_a_retired_init_has_no_init_code():
    """``damped`` (retired in 0.8.0): a checkpoint that recorded it loads its
    saved W and norms, so no init runs for it; asked for here, it is refused
    like any unknown init (natural_bias_options refuses it first, naming the
    replacement)."""
    assert ("natbias_weight_init", "damped") in output_projection.RETIRED
    with pytest.raises(ValueError, match="choose one of gain, fairseq, paper"):
        output_projection.init_output_weights(FakeDecoder(), "damped", None)


# --- the gain (weight init ``gain``, the default) --------------------------------


def test_gained_projection_is_g_w_phi_plus_b_and_keeps_the_tie():
    decoder = FakeDecoder(tied=True)
    values = torch.linspace(-5, -1, 50)
    output_projection.attach_output_bias(decoder, values)
    gained = output_projection.add_output_gain(decoder, gain_init=0.05, speed=20.0)
    assert decoder.output_projection is gained
    assert gained.weight is decoder.embed_tokens.weight  # still tied
    assert gained.bias is not None and torch.equal(gained.bias, values)
    assert gained.gain_param.item() == pytest.approx(0.05 / 20.0)  # g = C u, the default
    exp_gain = output_projection.add_output_gain(FakeDecoder(), 0.05, 20.0, "exp")
    assert exp_gain.gain_param.item() == pytest.approx(math.log(0.05) / 20.0)  # g = exp(C u)
    assert exp_gain.gain().item() == pytest.approx(0.05)
    assert gained.gain_param.dtype == torch.float32
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


def _one_adam_update(speed, form, lr=1e-3):
    torch.manual_seed(0)
    decoder = FakeDecoder()
    gained = output_projection.add_output_gain(decoder, 0.05, speed, form)
    optimizer = torch.optim.Adam([gained.gain_param], lr=lr, betas=(0.9, 0.997), eps=1e-8)
    features = torch.randn(8, 16)
    targets = torch.randint(0, 50, (8,))
    torch.nn.functional.cross_entropy(gained(features), targets).backward()
    grad_sign = torch.sign(gained.gain_param.grad).item()
    optimizer.step()
    return output_projection.output_gain(decoder).item(), grad_sign


@pytest.mark.parametrize("speed", [1.0, 20.0, 50.0])
def test_one_adam_update_moves_the_gain_by_speed_times_lr(speed):
    """The documented speed: Adam's first step on u is lr * sign(grad) (its
    bias-corrected m / sqrt(v) is grad / |grad|), whatever the gradient's
    size, so g = exp(C u) moves log g by exactly C * lr, and 0.2.0's
    g = C u moves g by C * lr."""
    lr = 1e-3
    gain, sign = _one_adam_update(speed, "exp", lr)
    assert math.log(gain / 0.05) == pytest.approx(-sign * speed * lr, rel=1e-4)
    gain, sign = _one_adam_update(speed, "linear", lr)
    assert gain - 0.05 == pytest.approx(-sign * speed * lr, rel=1e-4)


GAIN_OF = {"linear": lambda u, speed: u * speed, "exp": lambda u, speed: torch.exp(u * speed),
           "capped": lambda u, speed: torch.clamp(u * speed, max=1.0),
           "abs-capped": lambda u, speed: torch.clamp((u * speed).abs(), max=1.0)}


def _true_gain_gradient(gained, features, targets):
    """d loss / d u by plain autograd through g(u) and W (g phi) + b, with
    none of the projection's own backward."""
    u = gained.gain_param.detach().clone().requires_grad_()
    gain = GAIN_OF[gained.form](u, gained.speed)
    logits = torch.nn.functional.linear(features * gain, gained.weight, gained.bias)
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    return u.grad


@pytest.mark.parametrize("form", output_projection.GAIN_FORMS)
def test_the_gain_gradient_is_the_true_one_divided_by_speed_times_width(form):
    """What the optimiser sees for u: dL/du / (C d), d the feature width
    (see _ScaleByGain for why); every other gradient untouched."""
    torch.manual_seed(0)
    decoder = FakeDecoder()
    output_projection.attach_output_bias(decoder, torch.linspace(-5, -1, 50))
    gained = output_projection.add_output_gain(decoder, 0.05, 20.0, form)
    features = torch.randn(32, 16, requires_grad=True)
    targets = torch.randint(0, 50, (32,))
    torch.nn.functional.cross_entropy(gained(features), targets, reduction="sum").backward()
    true = _true_gain_gradient(gained, features.detach(), targets)
    torch.testing.assert_close(gained.gain_param.grad, true / (20.0 * 16), rtol=1e-5, atol=0)
    plain = features.detach().clone().requires_grad_()
    logits = torch.nn.functional.linear(plain * 0.05, gained.weight, gained.bias)
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    torch.testing.assert_close(features.grad, plain.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("form", output_projection.GAIN_FORMS)
def test_adam_moves_the_gain_as_with_the_true_gradient(form):
    """Adam is invariant to a constant scale of a parameter's gradient: ten
    updates with the divided gradient give the u of ten with the true one."""
    torch.manual_seed(0)
    decoder = FakeDecoder()
    gained = output_projection.add_output_gain(decoder, 0.05, 20.0, form)
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
        gain = GAIN_OF[form](reference_u, 20.0)
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
    scaled = output_projection._ScaleByGain.apply(features, gain, 1.0)
    scaled.backward(upstream)
    assert scaled.dtype == torch.float16
    assert gain.grad.item() == 2.0 * 4096 * 512


def test_a_half_model_keeps_bias_and_gain_in_float32():
    decoder = FakeDecoder(dim=16)
    values = torch.linspace(-20, -1, 50)
    output_projection.attach_output_bias(decoder, values)
    gained = output_projection.add_output_gain(decoder, 0.05, 20.0)
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


def test_the_exp_and_abs_capped_gains_stay_positive_where_linear_and_capped_flip():
    """Adam pushed down for 500 updates at C = 100, lr 1e-3: the linear and
    capped gains cross 0 (after 0.05 / (100 * 1e-3) = 0.5 updates' worth);
    exp's and abs-capped's cannot (abs-capped's turns back up at 0)."""
    for form, positive in (("exp", True), ("abs-capped", True), ("linear", False),
                           ("capped", False)):
        gained = output_projection.add_output_gain(FakeDecoder(), 0.05, 100.0, form)
        optimizer = torch.optim.Adam([gained.gain_param], lr=1e-3)
        for _ in range(500):
            optimizer.zero_grad()
            gained.gain().backward()  # d g / d u > 0: Adam lowers g
            optimizer.step()
        assert (gained.gain().item() > 0) == positive, form


def test_abs_capped_is_capped_while_c_u_is_positive_and_reflects_at_zero():
    """0.6.0's default against 0.4.0's: the same logits and gradients (u, W,
    the features) for C u in (0, 1] and above the cap, bit for bit, so every
    run whose gain stayed positive is the same run under either; for C u < 0
    abs-capped's g is |C u| and u's gradient changes sign with it."""
    torch.manual_seed(0)
    features, targets = torch.randn(32, 16), torch.randint(0, 50, (32,))
    results = {}
    for form in ("capped", "abs-capped"):
        torch.manual_seed(1)  # the same W for both
        decoder = FakeDecoder(dim=16)
        output_projection.attach_output_bias(decoder, torch.linspace(-5, -1, 50))
        gained = output_projection.add_output_gain(decoder, 0.05, 20.0, form)
        for u in (0.0025, 0.03, 0.07, -0.01):
            with torch.no_grad():
                gained.gain_param.fill_(u)
            gained.zero_grad()
            ours = features.clone().requires_grad_()
            logits = gained(ours)
            torch.nn.functional.cross_entropy(logits, targets).backward()
            results[form, u] = (gained.gain().item(), logits.detach(), ours.grad,
                                gained.weight.grad.clone(), gained.gain_param.grad.item())
    for u in (0.0025, 0.03, 0.07):
        for mine, theirs in zip(results["abs-capped", u], results["capped", u]):
            assert torch.equal(torch.as_tensor(mine), torch.as_tensor(theirs)), u
    gain, _, _, _, grad_u = results["abs-capped", -0.01]
    assert gain == pytest.approx(0.2)  # |20 * -0.01|
    assert results["capped", -0.01][0] == pytest.approx(-0.2)
    # the same logits as capped's g = +0.2 would give, u's gradient mirrored
    with torch.no_grad():
        gained.gain_param.fill_(0.01)
    gained.zero_grad()
    torch.nn.functional.cross_entropy(gained(features), targets).backward()
    assert grad_u == pytest.approx(-gained.gain_param.grad.item(), rel=1e-6)


def test_the_capped_gain_rises_by_speed_times_lr_then_holds_at_one():
    """Hand-worked: a loss that only ever asks for a larger g (-g), Adam at
    lr 1e-3, C = 20. A constant gradient makes every Adam step exactly lr
    (bias-corrected m / sqrt(v) = 1), so g = 0.05 + 0.02 k after k updates:
    0.25 after 10, 0.99 after 47; the 48th would reach 1.01 and is capped
    at 1. There u's gradient is 0, and the projection is W phi + b exactly:
    the paper's model."""
    decoder = FakeDecoder()
    values = torch.linspace(-5, -1, 50)
    output_projection.attach_output_bias(decoder, values)
    gained = output_projection.add_output_gain(decoder, 0.05, 20.0, "capped")
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
    output_projection.attach_output_bias(decoder, torch.linspace(-12, -1, 50))
    gained = output_projection.add_output_gain(decoder, 0.05, 20.0, "capped")
    with torch.no_grad():
        gained.gain_param.fill_(0.06)  # C u = 1.2: capped
    decoder.half()
    targets = torch.randint(0, 50, (64,))
    features = torch.randn(64, 16).half()
    ours = features.clone().requires_grad_()
    logits = gained(ours)
    (torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum")
     * 2.0 ** 7).backward()
    stock = features.clone().requires_grad_()
    weight = gained.weight.detach().clone().requires_grad_()
    plain = torch.nn.functional.linear(stock, weight, gained.bias.detach().half())
    (torch.nn.functional.cross_entropy(plain.float(), targets, reduction="sum")
     * 2.0 ** 7).backward()
    assert logits.dtype == torch.float16 and torch.equal(logits, plain)
    assert gained.gain_param.grad.item() == 0.0
    assert torch.isfinite(ours.grad).all() and torch.isfinite(gained.weight.grad).all()
    assert torch.equal(ours.grad, stock.grad) and torch.equal(gained.weight.grad, weight.grad)
    assert gained.bias.grad.dtype == torch.float32 and torch.isfinite(gained.bias.grad).all()


@pytest.mark.parametrize("form", output_projection.CAPPED_FORMS)
def test_the_capped_gain_refuses_to_start_at_its_cap(form):
    with pytest.raises(ValueError, match=f"natbias-gain-init 1 with --natbias-gain-form {form}:"):
        output_projection.add_output_gain(FakeDecoder(), 1.0, 20.0, form)


@pytest.mark.parametrize("option, value", [("gain_init", 0.0), ("gain_init", float("nan")),
                                           ("speed", -1.0)])
def test_bad_gain_settings_are_refused(option, value):
    settings = {"gain_init": 0.05, "speed": 20.0, option: value}
    with pytest.raises(ValueError, match="natbias-gain"):
        output_projection.add_output_gain(FakeDecoder(), **settings)


# --- the gain's schedule: ``lr`` (default) or ``peak`` --------------------------------


def test_warmup_speedup_is_peak_over_lr_during_the_warm_up():
    """Hand-worked: the paper's schedule, lr(t) = 1e-7 + t (5e-4 - 1e-7) / 4000."""
    speedup = output_projection.WarmupSpeedup(5e-4, 4000, 1e-7)
    step = (5e-4 - 1e-7) / 4000
    assert speedup(100) == pytest.approx(5e-4 / (1e-7 + 100 * step))  # 39.7
    assert speedup(1000) == pytest.approx(5e-4 / (1e-7 + 1000 * step))  # 4.0
    assert speedup(0) == 4000.0  # 5e-4 / 1e-7 = 5,000, capped at W
    assert speedup(4000) == speedup(20000) == 1.0
    assert output_projection.WarmupSpeedup(1e-3, 0)(0) == 1.0  # no warm-up
    assert output_projection.WarmupSpeedup(1e-3, 100, 0.0)(0) == 100.0  # from 0: the cap


PAPER_WARMUP = output_projection.WarmupSpeedup(5e-4, 4000, 1e-7)


def _peak_gain(form="exp", speed=100.0):
    torch.manual_seed(0)
    decoder = FakeDecoder()
    output_projection.attach_output_bias(decoder, torch.linspace(-5, -1, 50))
    return output_projection.add_output_gain(decoder, 0.05, speed, form, "peak", PAPER_WARMUP)


def _paper_lr(update):
    return 1e-7 + update * (5e-4 - 1e-7) / 4000


@pytest.mark.parametrize("form", output_projection.GAIN_FORMS)
def test_the_peak_schedule_moves_the_gain_by_speed_times_peak_lr(form):
    """Adam's first step is lr * sign(grad): at update t of the paper's
    warm-up the peak schedule moves g (log g) by C * lr(t) * m(t) = C * 5e-4,
    where the lr schedule moves it by C * lr(t) (here 3.1e-4 at t = 50)."""
    for update in (50, 1000):
        gained = _peak_gain(form, speed=20.0)
        gained.set_num_updates(update)
        before = gained._exponent().item()
        optimizer = torch.optim.Adam([gained.gain_param], lr=_paper_lr(update))
        features, targets = torch.randn(32, 16), torch.randint(0, 50, (32,))
        torch.nn.functional.cross_entropy(gained(features), targets).backward()
        optimizer.step()
        assert abs(gained._exponent().item() - before) == pytest.approx(20.0 * 5e-4, rel=1e-3)


def test_the_peak_schedule_keeps_g_continuous_and_folding_idempotent():
    gained = _peak_gain()
    optimizer = torch.optim.Adam([gained.gain_param], lr=1.0)
    for update in range(5):
        gained.set_num_updates(update)
        for group in optimizer.param_groups:
            group["lr"] = _paper_lr(update)
        optimizer.zero_grad()
        features, targets = torch.randn(32, 16), torch.randint(0, 50, (32,))
        torch.nn.functional.cross_entropy(gained(features), targets).backward()
        optimizer.step()
        after_step = gained.gain().item()
        gained.set_num_updates(update + 1)  # m changes from m(t) to m(t + 1) ...
        assert gained.gain().item() == pytest.approx(after_step, rel=1e-6)  # ... g does not
        gained.set_num_updates(update + 1)  # again (fairseq may call it twice)
        assert gained.gain().item() == pytest.approx(after_step, rel=1e-6)
        assert gained.gain_speedup.item() == pytest.approx(PAPER_WARMUP(update + 1))
    assert gained.gain().item() != pytest.approx(0.05, rel=1e-3)  # it moved


@pytest.mark.parametrize("form", output_projection.GAIN_FORMS)
def test_the_peak_schedule_hands_adam_the_gradient_of_the_lr_schedule(form):
    """u's gradient is divided by m(t) too, so it keeps its scale across the
    warm-up (Adam's averages would otherwise remember the m-times larger
    early ones): at the same g it equals the lr schedule's, whatever m."""
    torch.manual_seed(0)
    features, targets = torch.randn(32, 16), torch.randint(0, 50, (32,))
    gradients = []
    for schedule in ("lr", "peak"):
        torch.manual_seed(0)
        decoder = FakeDecoder()
        gained = output_projection.add_output_gain(decoder, 0.05, 20.0, form, schedule,
                                                   PAPER_WARMUP)
        gained.set_num_updates(30)  # m = 130
        torch.nn.functional.cross_entropy(gained(features), targets).backward()
        gradients.append(gained.gain_param.grad)
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-5, atol=0)


def test_the_peak_schedule_survives_half_precision_and_a_reload():
    """The anchors and m are float32 buffers (an fp16 anchor would put g off
    by C m (u - fp16(u))), saved with the model: a reloaded copy has the same
    g now and after the next fold."""
    gained = _peak_gain()
    optimizer = torch.optim.Adam([gained.gain_param], lr=_paper_lr(7))
    gained.set_num_updates(7)
    torch.nn.functional.cross_entropy(gained(torch.randn(8, 16)), torch.randint(0, 50, (8,))
                                      ).backward()
    optimizer.step()
    copy = _peak_gain()
    copy.load_state_dict(gained.state_dict())
    assert copy.gain().item() == gained.gain().item()
    for module in (gained, copy):
        module.set_num_updates(8)
    assert copy.gain().item() == gained.gain().item()
    copy.half()
    assert {copy.gain_exponent_anchor.dtype, copy.gain_param_anchor.dtype,
            copy.gain_speedup.dtype, copy.gain_param.dtype} == {torch.float32}
    assert copy.gain().item() == gained.gain().item()


def test_the_lr_schedule_adds_nothing_to_the_state_dict():
    """The default's saved keys are 0.3.2's, so its checkpoints load as they were."""
    gained = output_projection.add_output_gain(FakeDecoder(), 0.05, 20.0)
    assert set(gained.state_dict()) == {"weight", "gain_param"}


# Each scheduler's warm-up as a user writes it on the fairseq-train command
# line (40 warm-up updates, peak 5e-4); --warmup-init-lr left unset where the
# scheduler then starts elsewhere than 0 (cosine, step: --min-lr).
SCHEDULER_COMMANDS = {
    "inverse_sqrt": ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "40",
                     "--warmup-init-lr", "1e-7"],
    "inverse_sqrt from 0": ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", "40"],
    "cosine from --min-lr": ["--lr-scheduler", "cosine", "--warmup-updates", "40",
                             "--min-lr", "1e-5"],
    "step from --min-lr": ["--lr-scheduler", "step", "--warmup-updates", "40",
                           "--min-lr", "2e-5"],
    "polynomial_decay": ["--lr-scheduler", "polynomial_decay", "--warmup-updates", "40",
                         "--total-num-update", "1000"],
    "reduce_lr_on_plateau": ["--lr-scheduler", "reduce_lr_on_plateau",
                             "--warmup-updates", "40", "--warmup-init-lr", "1e-6"],
    "tri_stage steps": ["--lr-scheduler", "tri_stage", "--warmup-steps", "40",
                        "--hold-steps", "10", "--decay-steps", "50"],
    "tri_stage phase ratio": ["--lr-scheduler", "tri_stage", "--phase-ratio", "(0.4, 0.1, 0.5)"],
}


@pytest.mark.parametrize("command", sorted(SCHEDULER_COMMANDS))
def test_warmup_speedup_follows_fairseqs_own_scheduler(command):
    """m(t) read from the parsed command line is peak / lr(t) of the scheduler
    fairseq builds from the same line (capped at W), 1 after the warm-up."""
    from fairseq import optim, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.lr_scheduler import build_lr_scheduler

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused-data-dir", "--arch", "transformer", "--optimizer", "adam", "--lr", "5e-4",
        "--max-update", "100", *SCHEDULER_COMMANDS[command]])
    speedup = output_projection.WarmupSpeedup.from_args(args)  # before fairseq edits cfg
    cfg = convert_namespace_to_omegaconf(args)
    optimizer = optim.build_optimizer(cfg.optimizer, [nn.Parameter(torch.zeros(1))])
    scheduler = build_lr_scheduler(cfg.lr_scheduler, optimizer)
    assert speedup.warmup_updates == 40
    for update in range(0, 45):
        lr = scheduler.step_update(update)
        expected = 1.0 if update >= 40 else min(5e-4 / max(lr, 1e-30), 40.0)
        assert speedup(update) == pytest.approx(expected, rel=1e-6), update
