"""Half precision (fairseq's --fp16 casts the model with ``.half()``, --bf16
with ``.to(torch.bfloat16)``), checked in-process on the CPU: the plugin's own
parts stay finite and right, the stored log-unigram keeps float32, and the
logging hook computes in float32 without a host synchronisation per step.

Which dtype each part is kept in (fairseq_natbias/natural_bias.py):
    bias b, gain u             the model's dtype (parameters; fairseq's
                               half-precision optimisers keep float32 masters)
    target_log_unigram         float32 always (a statistic; bfloat16 would round
                               a rare token's -17 nats to the nearest 0.125)
    hook sums (kl_unigram ...) float32 tensors on the model's device
"""

import pytest
import torch

from natbias_testing import build_in_process, first_sentences

DTYPES = [torch.bfloat16, torch.float16]


class _NoBackward:
    """An optimizer stand-in for task.train_step: backward only."""

    def backward(self, loss):
        loss.backward()


def _built(data, tmp_path, *options):
    task, model, criterion = build_in_process(data, tmp_path, "--natbias-stats-interval", "1",
                                              "--dropout", "0", *options)
    return task, model, criterion


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cast_keeps_the_log_unigram_in_float32(toy_bin, tmp_path, dtype):
    _, model, _ = _built(toy_bin, tmp_path)
    log_unigram = model.target_log_unigram.clone()
    model.to(dtype)
    projection = model.decoder.output_projection
    assert projection.bias.dtype == dtype and projection.gain_param.dtype == dtype
    assert model.target_log_unigram.dtype == torch.float32
    assert torch.equal(model.target_log_unigram, log_unigram)
    model.float()
    assert torch.equal(model.target_log_unigram, log_unigram)
    state = model.state_dict()
    assert state["target_log_unigram"].dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_half_model_trains_finite_and_close_to_float32(toy_bin, tmp_path, dtype):
    """Forward, backward and get_normalized_probs finite under the cast; the
    loss within 1% of the float32 model's; the hook's statistics in float32
    and within 2% of float32's."""
    task, model, criterion = _built(toy_bin, tmp_path)
    sample = first_sentences(task, n=8)
    results = {}
    for run_dtype in (torch.float32, dtype):
        model.zero_grad()
        model.to(run_dtype)
        loss, _, logging_output = task.train_step(sample, model, criterion, _NoBackward(),
                                                  update_num=0)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g.float()).all() for g in grads)
        assert model.decoder.output_projection.bias.grad is not None
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        assert torch.isfinite(lprobs).all()
        kl = logging_output["natbias_kl_unigram"]
        assert torch.is_tensor(kl) and kl.dtype == torch.float32  # summed on the device
        results[run_dtype] = (loss.float().item(), kl.item(), logging_output["natbias_kl_uniform"].item())
    reference, half = results[torch.float32], results[dtype]
    assert half[0] == pytest.approx(reference[0], rel=0.01)
    assert half[1] == pytest.approx(reference[1], rel=0.02, abs=1e-3)
    assert half[2] == pytest.approx(reference[2], rel=0.02)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_statistics_are_computed_in_float32(toy_bin, tmp_path, dtype):
    _, model, _ = _built(toy_bin, tmp_path)
    reference = model.natbias_hook.bias_statistics()
    model.to(dtype)
    half = model.natbias_hook.bias_statistics()
    assert half["bias_norm"] == pytest.approx(reference["bias_norm"], rel=5e-3)
    assert half["gain"] == pytest.approx(reference["gain"], rel=5e-3)
    # b rounded to the dtype is no longer exactly log omega: KL small, not 0.
    assert 0.0 <= half["bias_kl"] < 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_generation_controls_under_half_precision(toy_bin, tmp_path, dtype):
    """lambda * b and tau log omega act on half logits without NaN."""
    task, model, _ = _built(toy_bin, tmp_path)
    sample = first_sentences(task, n=4)
    model.to(dtype).eval()
    model.natbias_args.natbias_bias_scale = 0.5
    model.natbias_args.natbias_logit_adjustment = 0.3
    with torch.no_grad():
        net_output = model(**sample["net_input"])
        controlled = model.get_normalized_probs(net_output, log_probs=True)
        logits = net_output[0].float()
        bias = model.decoder.output_projection.bias.float()
        expected = torch.log_softmax(logits - 0.5 * bias - 0.3 * model.target_log_unigram, -1)
    assert torch.isfinite(controlled).all()
    torch.testing.assert_close(controlled, expected, atol=0.1, rtol=0.02)
