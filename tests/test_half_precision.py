"""Half precision (fairseq's --fp16 casts the model with ``.half()``, --bf16
with ``.to(torch.bfloat16)``), checked in-process on the CPU: the plugin's own
parts stay finite and right, the stored log-unigram, the bias and the gain
keep float32, the logging hook computes in float32 without a host
synchronisation per step; and fairseq's own FP16Optimizer and
MemoryEfficientFP16Optimizer, with their dynamic loss scaler, train the
default at the loss scale they train stock fairseq at, on real text.

Which dtype each part is kept in (docs/half_precision.md):
    bias b, gain u             float32 (OutputProjection._apply): the memory-
                               efficient optimisers keep no float32 master
    target_log_unigram         float32 always (a statistic; bfloat16 would round
                               a rare token's -17 nats to the nearest 0.125)
    hook sums (kl_unigram ...) float32 tensors on the model's device
"""

import math

import pytest
import torch
from fairseq import optim, options, tasks, utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from natbias_testing import (
    REPO,
    TINY_LM,
    TINY_LM_TRAINING,
    TINY_MODEL,
    TINY_TRAINING,
    build_in_process,
    first_sentences,
    half_matmuls_in_float32,
)

DTYPES = [torch.bfloat16, torch.float16]


class _NoBackward:
    """An optimizer stand-in for task.train_step: backward only."""

    def backward(self, loss):
        loss.backward()


def _built(data, tmp_path, *options):
    task, model, criterion = build_in_process(
        data, tmp_path, "--natbias-stats-interval", "1", "--dropout", "0", *options
    )
    return task, model, criterion


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cast_keeps_the_log_unigram_in_float32(toy_bin, tmp_path, dtype):
    _, model, _ = _built(toy_bin, tmp_path)
    log_unigram = model.target_log_unigram.clone()
    model.to(dtype)
    projection = model.decoder.output_projection
    assert projection.bias.dtype == torch.float32 and projection.gain_param.dtype == torch.float32
    assert projection.weight.dtype == dtype
    assert model.target_log_unigram.dtype == torch.float32
    assert torch.equal(model.target_log_unigram, log_unigram)
    model.float()
    assert torch.equal(model.target_log_unigram, log_unigram)
    state = model.state_dict()
    assert state["target_log_unigram"].dtype == torch.float32


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.training
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
        loss, _, logging_output = task.train_step(
            sample, model, criterion, _NoBackward(), update_num=0
        )
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(torch.isfinite(g.float()).all() for g in grads)
        assert model.decoder.output_projection.bias.grad is not None
        lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True)
        assert torch.isfinite(lprobs).all()
        kl = logging_output["natbias_kl_unigram"]
        assert torch.is_tensor(kl) and kl.dtype == torch.float32  # summed on the device
        results[run_dtype] = (
            loss.float().item(),
            kl.item(),
            logging_output["natbias_kl_uniform"].item(),
        )
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
    # b and g stay float32: the same numbers; ||g W|| from the half W.
    assert half["bias_norm"] == reference["bias_norm"]
    assert half["gain"] == reference["gain"]
    assert half["bias_kl"] == reference["bias_kl"]
    assert half["weight_norm"] == pytest.approx(reference["weight_norm"], rel=5e-3)


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


# --- fairseq's half-precision optimisers, driven as fairseq's Trainer drives them ---
#
# fairseq's Trainer cannot take a gradient overflow on the CPU (it calls
# .cuda() on the overflow path), so the loop below does what its train_step
# does: backward with the scaled loss (task.train_step -> optimizer.backward),
# multiply_grads(1 / sample size), clip_grad_norm (where the DynamicLossScaler
# detects an overflow and halves the scale), step. The optimisers, the
# scaler and every number they see are fairseq's own. Their matrix products
# are computed as the CPU's half kernels compute them, at float32's speed
# (natbias_testing.half_matmuls_in_float32: float32 accumulation, one rounding
# to the half type); the tests above keep the real half kernels.

UPDATES = 8  # 0.2.0's default overflowed on each of its first 6


def _build_for_training(data, arch, flags, model, training):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        [
            str(data),
            "--user-dir",
            str(REPO / "fairseq_natbias"),
            "--arch",
            arch,
            *model,
            *training,
            "--save-dir",
            "/nonexistent",
            *flags,
        ],
    )
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def drive_half_precision(
    data, arch, flags, model=TINY_MODEL, training=TINY_TRAINING, updates=UPDATES, adapt=None
):
    """Train ``updates`` batches under fairseq's half-precision optimiser for
    ``flags``; returns the loss scale after each, the skipped (overflowed)
    updates, and the bias before and after (None without a bias). ``adapt``,
    if given, is applied to the float32 model (and its config) before the
    cast: a model as a checkpoint of another setting would build it."""
    half = torch.bfloat16 if "--bf16" in flags else torch.float16
    cfg, task, model, criterion = _build_for_training(data, arch, flags, model, training)
    if adapt is not None:
        adapt(model, cfg)
    model, criterion = model.to(half), criterion.to(half)  # what fairseq's Trainer does
    params = [p for p in model.parameters() if p.requires_grad]
    memory_efficient = "--memory-efficient-fp16" in flags or "--memory-efficient-bf16" in flags
    builder = optim.MemoryEfficientFP16Optimizer if memory_efficient else optim.FP16Optimizer
    optimizer = builder.build_optimizer(cfg, params)
    optimizer.set_lr(1e-3)
    task.load_dataset("train")
    batches = task.get_batch_iterator(
        task.dataset("train"), max_tokens=cfg.dataset.max_tokens, seed=1
    ).next_epoch_itr(shuffle=True)
    bias = model.decoder.output_projection.bias
    bias_before = None if bias is None else bias.detach().float().clone()
    scales, skipped = [], 0
    model.train()
    with half_matmuls_in_float32():
        for update, sample in zip(range(updates), batches):
            optimizer.zero_grad()
            _, sample_size, _ = task.train_step(sample, model, criterion, optimizer, update)
            optimizer.multiply_grads(1.0 / sample_size)
            try:
                optimizer.clip_grad_norm(0.0)
                optimizer.step()
            except OverflowError:  # the scaler halved the loss scale
                skipped += 1
            scales.append(optimizer.scaler.loss_scale if optimizer.scaler else None)
    bias_after = None if bias is None else bias.detach().float().clone()
    return {"scales": scales, "skipped": skipped, "bias": (bias_before, bias_after), "model": model}


FP16_FLAGS = {
    "fp16": ["--fp16", "--fp16-no-flatten-grads"],  # flattening needs CUDA
    "memory-efficient-fp16": ["--fp16", "--memory-efficient-fp16"],
}


@pytest.fixture(scope="module")
def fp16_runs(multi30k_bin):
    """The default under each optimiser and stock under --fp16 (the same
    gradients and scaler; the optimisers differ in the update only), tied,
    Multi30k De-En (joint 8k)."""
    tied = ["--share-all-embeddings"]
    runs = {
        ("transformer_natbias", name): drive_half_precision(
            multi30k_bin, "transformer_natbias", flags + tied
        )
        for name, flags in FP16_FLAGS.items()
    }
    runs["transformer"] = drive_half_precision(
        multi30k_bin, "transformer", FP16_FLAGS["fp16"] + tied
    )
    return runs


@pytest.mark.parametrize("optimiser", sorted(FP16_FLAGS))
@pytest.mark.training
def test_default_trains_at_stocks_loss_scale(fp16_runs, optimiser):
    """The gain's gradient (a sum over every token and feature) is reduced
    in float32 and preconditioned, so it no longer overflows fp16: 0.2.0's
    default fell to loss scale 2 with 6 skipped updates of 30 here, stock
    stays at 128."""
    default = fp16_runs["transformer_natbias", optimiser]
    stock = fp16_runs["transformer"]
    assert default["skipped"] <= stock["skipped"], (default["scales"], stock["scales"])
    for ours, theirs in zip(default["scales"], stock["scales"]):
        assert theirs / 2 <= ours <= theirs * 2, (default["scales"], stock["scales"])


@pytest.mark.parametrize("optimiser", sorted(FP16_FLAGS))
@pytest.mark.training
def test_rare_tokens_biases_keep_learning(fp16_runs, optimiser):
    """|b| >= 8, where fp16's spacing (0.0078) exceeds Adam's steps of about
    one learning rate: kept in float32, they move, also under
    --memory-efficient-fp16 (no float32 master copy; 0.2.0's moved none).
    Not quite all: label smoothing's target eps/|V| is the model's own
    probability for the rarest tokens, whose gradient can be exactly 0."""
    before, after = fp16_runs["transformer_natbias", optimiser]["bias"]
    rare = before < -8
    assert rare.sum() > 100  # the smoothed unigram of a Multi30k 8k vocabulary
    assert (after[rare] != before[rare]).float().mean() > 0.99
    assert torch.isfinite(after).all()


@pytest.mark.training
def test_unigram_label_smoothing_trains_at_stocks_loss_scale(fp16_runs, multi30k_bin):
    """unigram_label_smoothed_cross_entropy under --fp16's loss scaling: its
    unigram term is taken in float32 from fairseq's float32 log-probabilities,
    so the default skips no more updates than stock with the standard
    criterion, keeps its loss scale, and its rare tokens' biases move."""
    run = drive_half_precision(
        multi30k_bin,
        "transformer_natbias",
        FP16_FLAGS["fp16"]
        + ["--share-all-embeddings", "--criterion", "unigram_label_smoothed_cross_entropy"],
    )
    stock = fp16_runs["transformer"]
    assert run["skipped"] <= stock["skipped"], (run["scales"], stock["scales"])
    assert min(run["scales"]) >= min(stock["scales"]) / 2, (run["scales"], stock["scales"])
    before, after = run["bias"]
    rare = before < -8
    assert (after[rare] != before[rare]).float().mean() > 0.99
    assert torch.isfinite(after).all()


@pytest.mark.training
def test_memory_efficient_bf16_keeps_the_bias_learning(multi30k_bin):
    """bfloat16 spaces |b| >= 8 by 0.0625: with no float32 master copy, a
    bias held in bfloat16 could never move by 1e-3."""
    run = drive_half_precision(
        multi30k_bin, "transformer_natbias", ["--bf16", "--memory-efficient-bf16"], updates=5
    )
    before, after = run["bias"]
    rare = before < -8
    assert (after[rare] != before[rare]).float().mean() > 0.99
    assert run["model"].decoder.output_projection.bias.dtype == torch.float32


@pytest.mark.training
def test_language_model_trains_at_stocks_loss_scale(multi30k_lm_bin):
    runs = {
        arch: drive_half_precision(
            multi30k_lm_bin,
            arch,
            FP16_FLAGS["fp16"],
            model=TINY_LM,
            training=TINY_LM_TRAINING,
            updates=10,
        )
        for arch in ("transformer_lm_natbias", "transformer_lm")
    }
    ours, stock = runs["transformer_lm_natbias"], runs["transformer_lm"]
    assert ours["skipped"] <= stock["skipped"]
    assert min(ours["scales"]) >= min(stock["scales"]) / 2, (ours["scales"], stock["scales"])


# The package's IWSLT preset (transformer_natbias_iwslt_de_en: the paper's
# 6+6 layers, 4 heads, FFN 256, and d 256), given explicitly so that stock
# --arch transformer builds the same network.
IWSLT_SIZES = [
    "--encoder-layers",
    "6",
    "--decoder-layers",
    "6",
    "--encoder-embed-dim",
    "256",
    "--decoder-embed-dim",
    "256",
    "--encoder-ffn-embed-dim",
    "256",
    "--decoder-ffn-embed-dim",
    "256",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
]


def _iwslt_fp16_gradients(data, arch):
    """A function of the loss scale: the fp16 gradients of one batch of ~4k
    tokens through the IWSLT preset's network (tied), eval mode."""
    cfg, task, model, criterion = _build_for_training(
        data, arch, ["--share-all-embeddings", "--max-tokens", "4096"], IWSLT_SIZES, TINY_TRAINING
    )
    model, criterion = model.half().eval(), criterion.half()
    task.load_dataset("train")
    sample = next(
        iter(
            task.get_batch_iterator(task.dataset("train"), max_tokens=4096, seed=1).next_epoch_itr(
                shuffle=False
            )
        )
    )

    def gradients(loss_scale):
        model.zero_grad()
        with half_matmuls_in_float32():
            loss, _, _ = criterion(model, sample)
            (loss * loss_scale).backward()
        return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    return gradients


@pytest.mark.training
def test_iwslt_preset_gradients_are_finite_at_stocks_loss_scale(multi30k_bin):
    """The paper's IWSLT size: the largest power-of-2 loss scale (from
    fairseq's initial 128 down) at which stock's fp16 gradients are finite;
    at that scale every gradient of the default is finite too (0.2.0's gain
    gradient is inf there)."""
    stock = _iwslt_fp16_gradients(multi30k_bin, "transformer")
    largest = max(g.float().abs().max().item() for g in stock(1.0).values())
    scale = min(128.0, 2.0 ** math.floor(math.log2(65504 / largest)))
    while not all(torch.isfinite(g).all() for g in stock(scale).values()):
        scale /= 2  # an activation's gradient overflowed before a parameter's
    assert scale >= 1
    ours = _iwslt_fp16_gradients(multi30k_bin, "transformer_natbias")(scale)
    print(f"stock's loss scale: {scale:g} (largest gradient at 1: {largest:.0f})")
    assert not [name for name, g in ours.items() if not torch.isfinite(g).all()], scale
    gain = ours["decoder.output_projection.gain_param"]
    assert gain.dtype == torch.float32 and gain.abs() > 0
