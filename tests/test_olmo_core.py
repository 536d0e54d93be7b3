"""natbias.olmo_core: the natural bias in OLMo-core 3.0, checked against what
a user measures and what this test computes itself (docs/pretraining.md).

- A fresh OLMo-core 1M model given the natural bias from Multi30k English's
  numpy token files starts within 0.02 bits of the unigram cross-entropy
  that the test counts from those files itself; stock starts bits above.
- The counts are the targets OLMo-core's dataset yields (each instance's
  ids but its first; a file's remainder that fills no instance left out),
  as the test reads them instance by instance; padded ids get a finite floor.
- Every preset family (olmo2, olmo3, llama-like, gemma3-like) starts at the
  unigram; a model built on the meta device gets b back after OLMo-core's
  init_weights, which zeroes head biases.
- The callback's statistics reach OLMo-core's metrics, and it writes b into
  a stock head's bias before a fresh run.
- Bad input is refused in one line, the model left as it was.
- OLMo-core's transformers conversion, then natbias.hf: b and the gain kept,
  greedy tokens identical to OLMo-core's generation module.
(2 gloo processes: tests/test_olmo_core_scaling.py.)
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import olmo_tiny
import pytest
import torch
from torch import nn

from natbias.errors import NaturalBiasError
from natbias.olmo_core import NaturalBiasCallback, _compat, add_natural_bias, count_targets
from natbias.olmo_core.natural_bias import NaturalBiasModel
from natbias.prior import log_unigram

torch.set_num_threads(1)
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(scope="module")
def token_files(tmp_path_factory):
    return olmo_tiny.multi30k_token_files(tmp_path_factory)


@pytest.fixture(scope="module")
def fresh(token_files, tmp_path_factory):
    """OLMo-core's 1M preset built on the meta device, given the natural bias
    from the training file, then initialised by OLMo-core."""
    model = olmo_tiny.model_1m(meta=True)
    work = tmp_path_factory.mktemp("olmo_work")
    add_natural_bias(model, olmo_tiny.dataset_config([token_files["train"]], work))
    model.init_weights(device=torch.device("cpu"), max_seq_len=olmo_tiny.SEQUENCE_LENGTH)
    return model


def reference_log_prior(path, vocab_size=1024, length=olmo_tiny.SEQUENCE_LENGTH):
    """The test's own add-one log-unigram of the file's targets: its ids cut
    into instances of ``length``, each but its first (the remainder dropped)."""
    ids = np.fromfile(path, dtype=np.uint16)
    targets = ids[: ids.size // length * length].reshape(-1, length)[:, 1:]
    counts = np.bincount(targets.reshape(-1), minlength=vocab_size) + 1.0
    return np.log(counts / counts.sum())


def test_a_fresh_model_starts_within_0_02_bits_of_the_unigram(token_files, fresh):
    log_prior = reference_log_prior(token_files["train"])
    ids = np.fromfile(token_files["val"], dtype=np.uint16).astype(np.int64)
    length = olmo_tiny.SEQUENCE_LENGTH
    targets = ids[: ids.size // length * length].reshape(-1, length)[:, 1:]
    unigram_bits = -log_prior[targets].mean() / math.log(2)
    natural = olmo_tiny.validation_bits(fresh, token_files["val"])
    stock = olmo_tiny.model_1m(meta=True)
    stock.init_weights(device=torch.device("cpu"), max_seq_len=length)
    stock_bits = olmo_tiny.validation_bits(stock, token_files["val"])
    print(
        f"step 0 validation: natural bias {natural:.4f} bits, unigram {unigram_bits:.4f}, stock {stock_bits:.4f}"
    )
    assert abs(natural - unigram_bits) < 0.02
    assert stock_bits > unigram_bits + 1.0


def test_b_survives_init_weights_and_padded_ids_get_a_finite_floor(token_files, fresh):
    head = fresh.lm_head.w_out
    counts = np.bincount(np.fromfile(token_files["train"], dtype=np.uint16), minlength=1024)
    assert counts[olmo_tiny.VOCAB :].sum() == 0  # the 24 padded ids never occur
    b = head.bias.detach().double().numpy()
    assert np.isfinite(b).all()
    tokens = fresh.lm_head.w_out.natbias_settings["prior_tokens"]
    floor = math.log(1.0 / (tokens + 1024))
    np.testing.assert_allclose(b[olmo_tiny.VOCAB :], floor, rtol=1e-6)
    np.testing.assert_allclose(b, reference_log_prior(token_files["train"]), atol=1e-5)
    assert head.bias.dtype == torch.float32 and abs(head.gain().item() - 0.05) < 1e-6


def test_the_counts_are_the_targets_the_dataset_yields(tmp_path):
    """Two files whose lengths are no multiple of the sequence length."""
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate((1000, 777)):
        paths.append(tmp_path / f"part{i}.npy")
        rng.zipf(1.3, size).clip(max=999).astype(np.uint16).tofile(paths[-1])
    config = olmo_tiny.dataset_config(paths, tmp_path / "work", sequence_length=50)
    dataset = config.build()
    expected = np.zeros(1024, dtype=np.int64)
    for i in range(len(dataset)):  # as OLMo-core's get_labels sees each instance
        expected += np.bincount(np.asarray(dataset[i]["input_ids"])[1:], minlength=1024)
    assert len(dataset) == 20 + 15
    np.testing.assert_array_equal(count_targets(config, 1024), expected)
    np.testing.assert_array_equal(count_targets(dataset, 1024), expected)


def test_label_masks_are_counted_as_get_labels_masks_them(tmp_path):
    """A dataset with label masks: counted instance by instance, each
    instance's ids but its first where its mask is true."""
    rng = np.random.default_rng(2)
    ids, mask = tmp_path / "ids.npy", tmp_path / "mask.npy"
    tokens = rng.integers(0, 1000, 500).astype(np.uint16)
    keep = rng.random(500) < 0.6
    tokens.tofile(ids)
    keep.astype(np.bool_).tofile(mask)
    config = olmo_tiny.dataset_config([ids], tmp_path / "work", sequence_length=50)
    config.label_mask_paths = [str(mask)]
    instances = tokens.reshape(10, 50)[:, 1:], keep.reshape(10, 50)[:, 1:]
    expected = np.bincount(instances[0][instances[1]], minlength=1024)
    np.testing.assert_array_equal(count_targets(config, 1024), expected)


PRESETS = {
    "olmo2_1M": lambda c: c.olmo2_1M(vocab_size=256),
    "olmo3_1M": lambda c: c.olmo3_1M(vocab_size=256),
    "llama_like": lambda c: c.llama_like(d_model=16, vocab_size=256, n_layers=1, n_heads=2),
    "gemma3_like": lambda c: c.gemma3_like(
        d_model=16, vocab_size=256, n_layers=1, n_heads=2, n_kv_heads=1, hidden_size=32
    ),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_family_starts_at_its_unigram(preset):
    from olmo_core.nn.transformer import TransformerConfig

    counts = np.random.default_rng(1).zipf(1.5, 256).clip(max=10**6)
    model = PRESETS[preset](TransformerConfig).build(init_device="meta")
    add_natural_bias(model, counts=counts)
    assert isinstance(model, NaturalBiasModel) and isinstance(model, type(model).__mro__[2])
    model.init_weights(device=torch.device("cpu"), max_seq_len=16)
    with torch.no_grad():
        log_p = model(torch.randint(0, 256, (2, 16))).log_softmax(-1).double()
    reference = torch.from_numpy(np.log((counts + 1.0) / (counts + 1.0).sum()))
    kl_bits = (log_p.exp() * (log_p - reference)).sum(-1).mean().item() / math.log(2)
    assert kl_bits < 0.01, kl_bits


class Recorder(_compat.Callback):
    """Keeps every step's metrics as the trainer hands them to its destinations."""

    def __init__(self):
        self.steps = {}

    def log_metrics(self, step, metrics):
        self.steps.setdefault(step, {}).update(metrics)


@pytest.fixture(scope="module")
def trained(token_files, tmp_path_factory):
    """OLMo-core's olmo2 family at 1M parameters (3 heads of 4, which its
    transformers conversion needs: the 1M preset's 4 heads of 4 over 12
    dimensions do not convert, stock or not), given the natural bias with a
    slow gain (C = 2, so that g is still below 1), trained 60 updates by
    OLMo-core's Trainer with the callback."""
    root = tmp_path_factory.mktemp("olmo_trained")
    model = olmo_tiny.model_1m(n_heads=3)
    dataset = olmo_tiny.dataset_config([token_files["train"]], root / "work").build()
    add_natural_bias(model, dataset, gain_speed=2.0)
    module = olmo_tiny.train_module(model, lr=1e-2, warmup=5)
    callbacks = [("natbias", NaturalBiasCallback()), ("rec", Recorder())]
    trainer = olmo_tiny.trainer(module, dataset, root / "run", 60, callbacks, no_checkpoints=True)
    trainer.fit()
    return model, trainer.callbacks["rec"]  # the trainer's own (its config may copy callbacks)


@pytest.mark.training  # OLMo-core's Trainer
def test_the_callback_puts_the_statistics_in_olmo_cores_metrics(token_files, trained):
    model, recorder = trained
    assert set(range(1, 61)) <= set(recorder.steps)
    last = recorder.steps[60]
    for name in ("bias_kl", "bias_norm", "weight_norm", "gain"):
        assert f"natbias/{name}" in last, sorted(last)
    # bias_kl, recomputed here from the trained b and the test's own prior
    b = model.lm_head.w_out.bias.detach().double().log_softmax(-1)
    prior = torch.from_numpy(reference_log_prior(token_files["train"]))
    kl = (b.exp() * (b - prior)).sum().item() / math.log(2)
    assert 0 < last["natbias/bias_kl"] and abs(last["natbias/bias_kl"] - kl) < 1e-4
    assert last["natbias/gain"] == pytest.approx(model.lm_head.w_out.gain().item(), abs=1e-6)
    # g starts at 0.05 and Adam moves it by about C = 2 learning rates (<= 1e-2) a step
    assert 0 < abs(recorder.steps[1]["natbias/gain"] - 0.05) < 2 * 1e-2


@pytest.mark.training  # OLMo-core's Trainer
def test_the_callback_writes_b_into_a_stock_heads_bias(token_files, tmp_path):
    from olmo_core.nn.transformer import TransformerConfig

    config = TransformerConfig.olmo2_1M(vocab_size=1024)
    config.lm_head.bias = True
    model = config.build(init_device="meta")
    dataset = olmo_tiny.dataset_config([token_files["train"]], tmp_path / "work").build()
    module = olmo_tiny.train_module(model, lr=1e-4, warmup=1)
    assert model.lm_head.w_out.bias.abs().max() == 0  # OLMo-core's init zeroes it
    olmo_tiny.trainer(
        module, dataset, tmp_path / "run", 1, [("natbias", NaturalBiasCallback())]
    ).fit()
    prior = reference_log_prior(token_files["train"])
    b = model.lm_head.w_out.bias.detach().double().numpy()
    assert np.abs(b - prior).max() < 5e-3  # written before the first step, moved by one
    with pytest.raises(NaturalBiasError, match="no bias"):
        stock = olmo_tiny.model_1m()
        olmo_tiny.trainer(
            olmo_tiny.train_module(stock),
            dataset,
            tmp_path / "run2",
            1,
            [("nb", NaturalBiasCallback())],
        ).fit()


# --- bad input: one line each, nothing written ---------------------------------


def one_line_refusal(call, match):
    with pytest.raises(NaturalBiasError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


def assert_untouched(model):
    assert type(model) is _compat.Transformer and type(model.lm_head.w_out) is nn.Linear


def test_token_files_with_ids_beyond_the_vocabulary_are_refused(tmp_path):
    path = tmp_path / "ids.npy"
    np.array([1, 2, 1500, 3] * 100, dtype=np.uint16).tofile(path)
    model = olmo_tiny.model_1m()
    config = olmo_tiny.dataset_config([path], tmp_path / "work", sequence_length=8)
    one_line_refusal(lambda: add_natural_bias(model, config), "token id 1500, outside")
    assert_untouched(model)


def test_a_tied_head_is_refused():
    model = olmo_tiny.model_1m(tie_word_embeddings=True)
    one_line_refusal(lambda: add_natural_bias(model, counts=np.ones(1024)), "ties its LM head")
    assert type(model) is _compat.Transformer and model.lm_head.w_out.bias is None


def test_counts_from_another_tokenizer_are_refused(tmp_path):
    model = olmo_tiny.model_1m()
    one_line_refusal(lambda: add_natural_bias(model, counts=np.ones(32000)), "another tokenizer")
    path = tmp_path / "ids.npy"
    np.arange(64, dtype=np.uint16).tofile(path)
    config = olmo_tiny.dataset_config([path], tmp_path / "work", sequence_length=8)
    config.tokenizer.vocab_size = 50_000
    one_line_refusal(lambda: add_natural_bias(model, config), "another tokenizer")
    assert_untouched(model)


def test_without_olmo_core_the_import_says_what_to_install_in_one_line():
    code = "import sys; sys.modules['olmo_core'] = None; import natbias.olmo_core"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode != 0 and last.startswith("natbias.errors.MissingExtraError")
    assert "fairseq-natbias[olmo]" in last


def test_an_olmo_core_version_outside_the_tested_range_is_refused():
    assert _compat.check_version("3.0.0") == "3.0.0"
    for version in ("3.1.0", "2.4.0", "4.0"):
        one_line_refusal(lambda v=version: _compat.check_version(v), f"not {version}")


def test_the_prior_is_the_cores():
    counts = np.arange(1024)
    model = olmo_tiny.model_1m(meta=False)
    add_natural_bias(model, counts=counts, smoothing=0.5)
    assert torch.equal(model.natbias_log_prior, log_unigram(counts, 0.5))
    # and its values, add-0.5 counted here in float64 (rounded to float32 once: |x| 2^-24)
    expected = torch.from_numpy(np.log((counts + 0.5) / (counts.sum() + 0.5 * len(counts))))
    torch.testing.assert_close(model.natbias_log_prior.double(), expected, rtol=2**-24, atol=0)
    model.to(torch.bfloat16)  # b and u stay float32 where the model is cast
    head = model.lm_head.w_out
    assert (
        head.weight.dtype == torch.bfloat16
        and head.bias.dtype == head.gain_param.dtype == torch.float32
    )
    one_line_refusal(lambda: add_natural_bias(model, counts=counts), "already")


# --- the way out: OLMo-core's transformers conversion, then natbias.hf ----------


@pytest.mark.training  # OLMo-core's Trainer
def test_the_transformers_conversion_keeps_b_and_the_gain_and_greedy_tokens(
    token_files, trained, tmp_path
):
    import olmo_core.distributed.parallel as olmo_parallel
    from olmo_core.generate.generation_module import TransformerGenerationModule
    from olmo_core.generate.generation_module.config import GenerationConfig

    import natbias.hf
    from natbias.olmo_core import to_hf

    model, _ = trained
    head = model.lm_head.w_out
    assert 0.1 < head.gain().item() < 0.99  # a gain that is neither its start nor 1
    to_hf(model, tmp_path / "hf")
    loaded = natbias.hf.from_pretrained(str(tmp_path / "hf")).eval()
    assert type(loaded).__name__ == "NaturalBiasOlmo2ForCausalLM"
    hf_head = loaded.get_output_embeddings()
    assert torch.equal(hf_head.bias, head.bias.detach())
    assert hf_head.gain().item() == pytest.approx(head.gain().item(), abs=1e-7)
    ids = np.fromfile(token_files["val"], dtype=np.uint16)[: 8 * 12].astype(np.int64)
    prompts = torch.from_numpy(ids).view(8, 12)
    model.eval()
    with torch.no_grad():
        difference = (model(prompts) - loaded(prompts).logits).abs().max().item()
    assert difference < 1e-5
    # greedy decoding: OLMo-core's generation module (the trained state loaded
    # into a fresh natural-bias model) against transformers' generate
    olmo_parallel._WORLD_MESH = None  # built by the training fixtures in this process
    fresh = olmo_tiny.model_1m(n_heads=3)
    add_natural_bias(fresh, counts=head.natbias_counts, gain_speed=2.0)
    config = GenerationConfig(
        pad_token_id=0, eos_token_id=1023, max_new_tokens=16, do_sample=False, use_cache=False
    )  # 1023, a padded id, never comes: every sequence runs the 16 tokens
    generator = TransformerGenerationModule(fresh, config, device=torch.device("cpu"))
    generator.load_state_dict({"model": model.state_dict()})
    olmo_tokens, _, _ = generator.generate_batch(prompts, log_timing=False)
    hf_tokens = loaded.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=16, do_sample=False,
        eos_token_id=1023, pad_token_id=0,
    )  # fmt: skip
    assert olmo_tokens.shape == hf_tokens.shape == (8, 12 + 16)
    assert torch.equal(olmo_tokens, hf_tokens)
    # vLLM serves the export (tests/test_vllm.py's olmo2); CTranslate2 has no
    # OLMo 2 loader at all, which the converter says in one line
    from natbias.hf.ct2 import to_ctranslate2

    one_line_refusal(
        lambda: to_ctranslate2(str(tmp_path / "hf"), str(tmp_path / "ct2")),
        "has no loader for Olmo2Config",
    )
    assert not (tmp_path / "ct2").exists()
