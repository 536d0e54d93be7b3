"""transformer_lm_natbias with fairseq's language_modeling task: the bias is the
log-unigram of the task's own next-token targets (checked against the targets
fairseq's dataset yields), a fresh default model predicts the unigram on real
text, and the real fairseq-train / fairseq-eval-lm / fairseq-validate and
Python sampling work, with one-line errors for what cannot work."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from natbias_testing import (
    NO_LOADER_PROCESS,
    TINY_LM,
    fairseq,
    load_fairseq_model,
    log_records,
    train_lm,
)
from test_counts import hand_counts
from test_scoring_in_context import stream_blocks

from fairseq_natbias import numpy_compat, training_data
from fairseq_natbias.cli.step0 import build_from_training_args, validation_divergence

LM_TASK = ["--task", "language_modeling", "--tokens-per-sample", "32"]


def build_lm(data, *options, arch="transformer_lm_natbias"):
    """The model fairseq-train would build, without training it."""
    argv = [
        str(data),
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        arch,
        *TINY_LM,
        *LM_TASK,
        "--cpu",
        "--seed",
        "1",
        "--save-dir",
        "/nonexistent/ckpt",
        *map(str, options),
    ]
    return build_from_training_args(argv)


def targets_the_task_yields(task, split="train"):
    """Independent count: every target token of every item fairseq's
    language_modeling dataset gives the trainer (pads excluded)."""
    task.load_dataset(split)
    dataset = task.dataset(split)
    counts = np.zeros(len(task.target_dictionary), dtype=np.int64)
    for i in range(len(dataset)):
        target = dataset[i]["target"].numpy()
        counts += np.bincount(target[target != task.target_dictionary.pad()], minlength=len(counts))
    return counts


def log_unigram_of(counts, alpha=1.0):
    counts = counts.astype(np.float64)
    return np.log((counts + alpha) / (counts.sum() + alpha * len(counts)))


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--share-decoder-input-output-embed"],
        ["--add-bos-token", "--sample-break-mode", "eos"],
        ["--add-bos-token"],  # blocks of 32 tokens across sentences
        ["--output-dictionary-size", "20"],
    ],
    ids=["untied", "tied", "bos-eos-blocks", "bos-none-blocks", "output-dictionary-20"],
)
def test_bias_is_log_unigram_of_the_tasks_targets(toy_lm_bin, options):
    _, task, model = build_lm(toy_lm_bin, *options)
    expected = targets_the_task_yields(task)
    bias = model.decoder.output_projection.bias.detach().double().numpy()
    assert len(bias) == len(task.target_dictionary)
    np.testing.assert_allclose(bias, log_unigram_of(expected), atol=1e-5)


def test_counts_are_the_hand_count_of_the_text(toy_text, toy_lm_bin):
    """EOS included (one per line, which dict.txt drops); --add-bos-token with
    --sample-break-mode eos adds one <s> per sentence."""
    dictionary = Dictionary.load(str(toy_lm_bin / "dict.txt"))
    hand = hand_counts(toy_text / "train.tgt", dictionary)

    def count(**cfg):
        return training_data.count_lm_targets(
            str(toy_lm_bin), "train", dictionary, SimpleNamespace(tokens_per_sample=32, **cfg)
        )

    counts = count()
    np.testing.assert_array_equal(counts, hand)
    with_bos = count(add_bos_token=True, sample_break_mode="eos")
    assert with_bos[dictionary.bos()] == hand[dictionary.eos()] == 400
    folded = count(output_dictionary_size=20)
    assert len(folded) == 20 and folded.sum() == hand.sum()
    assert folded[dictionary.unk()] == hand[dictionary.unk()] + hand[20:].sum()


@pytest.mark.parametrize(
    "tying", [[], ["--share-decoder-input-output-embed"]], ids=["untied", "tied"]
)
def test_default_lm_starts_at_the_unigram(multi30k_lm_bin, multi30k_text, tying):
    """Fig. 1 at update 0 for a language model on real text (Multi30k English,
    SentencePiece): validation NLL within 0.05 bits of the unigram's
    cross-entropy counted here, KL from its prior below 0.03 bits, with the
    default settings; the zero bias is far from it."""
    dictionary = Dictionary.load(str(multi30k_lm_bin / "dict.txt"))
    train = hand_counts(multi30k_text / "train.en", dictionary)
    log_u = log_unigram_of(train)
    _, task, model = build_lm(multi30k_lm_bin, *tying)
    fresh = validation_divergence(task, model)
    valid = targets_the_task_yields(task, "valid")
    unigram_ce_bits = -(valid * log_u).sum() / valid.sum() / math.log(2)
    _, task, zero = build_lm(multi30k_lm_bin, *tying, "--natbias-init", "zero")
    zero_result = validation_divergence(task, zero)
    assert fresh["tokens"] == valid.sum()
    assert abs(fresh["nll"] - unigram_ce_bits) < 0.05, (fresh, unigram_ce_bits)
    assert fresh["kl_unigram"] < 0.03, fresh
    assert zero_result["nll"] > unigram_ce_bits + 3.0, zero_result


@pytest.fixture(scope="module")
def lm_run(toy_lm_bin, tmp_path_factory):
    """2 updates, then resumed to 4; the log of each part."""
    save_dir = tmp_path_factory.mktemp("lm_run")
    every = ["--validate-interval-updates", "1"]
    first = train_lm(toy_lm_bin, save_dir, *every, max_update=2)
    after_two = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")["model"]
    second = train_lm(toy_lm_bin, save_dir, *every, max_update=4)
    (save_dir / "train.log").write_text(first.stdout + first.stderr + second.stdout + second.stderr)
    return save_dir, first.stdout + first.stderr, second.stdout + second.stderr, after_two


@pytest.mark.training
def test_lm_trains_logs_and_resumes_without_recounting(lm_run):
    save_dir, first, second, after_two = lm_run
    assert "target unigram:" in first and "target unigram:" not in second
    assert "@ 2 updates" in second
    inner = log_records(second, "train_inner")
    assert {"kl_unigram", "kl_uniform", "bias_kl", "bias_norm", "gain", "weight_norm"} <= set(
        inner[-1]
    )
    final = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu")["model"]
    key = "decoder.output_projection.bias"
    assert not torch.equal(final[key], after_two[key])  # kept training the loaded bias
    assert torch.equal(final["target_log_unigram"], after_two["target_log_unigram"])


@pytest.mark.training
def test_eval_lm_and_validate_need_no_training_split(lm_run, toy_lm_bin, toy_text, fresh_copy):
    save_dir = lm_run[0]
    data = fresh_copy(toy_lm_bin)
    for path in data.glob("train.*"):
        path.unlink()
    evaluated = fairseq(
        "fairseq-eval-lm",
        *NO_LOADER_PROCESS,
        data,
        "--user-dir",
        "fairseq_natbias",
        "--path",
        save_dir / "checkpoint_last.pt",
        "--cpu",
        "--max-tokens",
        "1024",
        "--tokens-per-sample",
        "32",
    )
    assert "Perplexity" in evaluated.stderr + evaluated.stdout
    assert "target unigram:" not in evaluated.stderr + evaluated.stdout
    validated = fairseq(
        "fairseq-validate",
        *NO_LOADER_PROCESS,
        data,
        "--task",
        "language_modeling",
        "--user-dir",
        "fairseq_natbias",
        "--path",
        save_dir / "checkpoint_last.pt",
        "--cpu",
        "--max-tokens",
        "1024",
        "--tokens-per-sample",
        "32",
        "--required-batch-size-multiple",  # fairseq's default 8 drops 2 of the 10 blocks
        "1",
    )
    values = log_records(validated.stdout + validated.stderr, "valid")[-1]
    # computed here in float64: the validation text's blocks, each position's
    # KL from the prior counted from the training text and from the uniform
    model, task = load_fairseq_model(save_dir / "checkpoint_last.pt", data)
    model = model.double()
    dictionary = task.target_dictionary
    log_u = log_unigram_of(hand_counts(toy_text / "train.tgt", dictionary))
    blocks, first = stream_blocks(dictionary, (toy_text / "valid.tgt").read_text().splitlines())
    kl_unigram, kl_uniform = [], []
    with torch.no_grad():
        for block, start in zip(blocks, first):
            logits = model(torch.tensor([[start, *block[:-1]]]))[0][0]
            log_p = torch.log_softmax(logits, -1).numpy()
            p = np.exp(log_p)
            kl_unigram += list((p * (log_p - log_u)).sum(-1))
            kl_uniform += list((p * (log_p + math.log(len(dictionary)))).sum(-1))
    b = model.decoder.output_projection.bias.detach().numpy()
    log_b = b - np.logaddexp.reduce(b)
    expected = {
        "kl_unigram": np.mean(kl_unigram) / math.log(2),
        "kl_uniform": np.mean(kl_uniform) / math.log(2),
        "bias_kl": (np.exp(log_b) * (log_b - log_u)).sum() / math.log(2),
    }
    for key, value in expected.items():  # fairseq logs 3 decimals; float32 far below that
        assert values[key] == pytest.approx(value, abs=5e-4 + 1e-5), key
    assert expected["kl_uniform"] > 0.5  # a model at the unigram, far from the uniform


@pytest.mark.training
def test_python_sampling_with_the_bias_scaled(lm_run, toy_lm_bin, fresh_copy):
    """``from_pretrained`` with only the dictionary and the checkpoint; lambda
    (Kobayashi et al.) through its overrides: lambda = 0 is the model without b."""
    from fairseq_natbias.transformer_lm_natbias import TransformerLanguageModelNatbias

    data = fresh_copy(toy_lm_bin)
    for path in list(data.glob("train.*")) + list(data.glob("valid.*")):
        path.unlink()
    save_dir = lm_run[0]
    hub = TransformerLanguageModelNatbias.from_pretrained(
        str(save_dir), "checkpoint_last.pt", data_name_or_path=str(data)
    )
    torch.manual_seed(1)
    sampled = hub.sample("t0 t1", sampling=True, sampling_topk=5, max_len_b=8)
    assert sampled.startswith("t0 t1") and len(sampled.split()) > 2
    scaled = TransformerLanguageModelNatbias.from_pretrained(
        str(save_dir), "checkpoint_last.pt", data_name_or_path=str(data), natbias_bias_scale=0.0
    )
    tokens = hub.encode("t0 t1 t2").unsqueeze(0)
    with torch.no_grad():
        plain_model, scaled_model = hub.models[0], scaled.models[0]  # in eval mode
        logits = plain_model(tokens)[0]
        bias = plain_model.decoder.output_projection.bias
        expected = torch.log_softmax(logits - bias, dim=-1)
        got = scaled_model.get_normalized_probs(scaled_model(tokens), log_probs=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--adaptive-softmax-cutoff", "10,20"], "adaptive-softmax-cutoff"),
        (["--adaptive-input", "--adaptive-input-cutoff", "10,20"], "--adaptive-input"),
        (["--character-embeddings"], "--character-embeddings splits: drop it"),
        (["--natbias-init", "file"], "needs --natbias-counts"),
    ],
)
@pytest.mark.training
def test_lm_bad_options_fail_with_one_line(toy_lm_bin, tmp_path, options, message):
    result = train_lm(toy_lm_bin, tmp_path / "ckpt", *options, check=False)
    assert result.returncode != 0
    assert message in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr


@pytest.mark.training
def test_lm_without_training_split_names_the_file(toy_lm_bin, fresh_copy, tmp_path):
    data = fresh_copy(toy_lm_bin)
    for path in data.glob("train.*"):
        path.unlink()
    result = train_lm(data, tmp_path / "ckpt", check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode != 0 and "train.bin" in last and "--only-source" in last


@pytest.mark.training
def test_stock_lm_path_works_with_the_plugin_under_numpy_2(toy_lm_bin, tmp_path):
    """fairseq 0.12 calls numpy.compat.long (--sample-break-mode eos), which
    numpy 2 removed; with --user-dir fairseq_natbias stock transformer_lm trains."""
    result = train_lm(
        toy_lm_bin,
        tmp_path / "ckpt",
        "--sample-break-mode",
        "eos",
        arch="transformer_lm",
        max_update=1,
    )
    assert "done training" in result.stderr + result.stdout


def test_numpy_shim_only_adds_what_is_missing(monkeypatch):
    import numpy

    monkeypatch.delattr(numpy, "compat", raising=False)
    assert numpy_compat.install() is True and numpy.compat.long is int
    marker = numpy.compat
    assert numpy_compat.install() is False and numpy.compat is marker


def test_lm_presets_mirror_fairseq(toy_lm_bin):
    """transformer_lm_natbias_gpt has transformer_lm_gpt's sizes (built, not trained)."""
    argv = [
        str(toy_lm_bin),
        "--user-dir",
        "fairseq_natbias",
        *LM_TASK,
        "--cpu",
        "--save-dir",
        "/nonexistent/ckpt",
    ]
    cfg, _, natbias = build_from_training_args([*argv, "--arch", "transformer_lm_natbias_gpt"])
    _, _, stock = build_from_training_args([*argv, "--arch", "transformer_lm_gpt"])
    stock_shapes = {k: v.shape for k, v in stock.state_dict().items()}
    natbias_shapes = {k: v.shape for k, v in natbias.state_dict().items()}
    extra = {
        "decoder.output_projection.bias",
        "decoder.output_projection.gain_param",
        "target_log_unigram",
    }
    assert set(natbias_shapes) - set(stock_shapes) == extra
    assert all(natbias_shapes[k] == shape for k, shape in stock_shapes.items())
    assert cfg.model.activation_fn == "gelu" and cfg.model.decoder_layers == 12


def test_stock_transformer_lm_is_the_same_network_given_its_dims_and_norm(toy_lm_bin):
    """fairseq 0.12's --arch transformer_lm skips base_lm_architecture (post-norm,
    512-wide input/output embeddings whatever --decoder-embed-dim says); ours
    applies it. With the three options explicit, only the bias and gain differ
    (docs/language_models.md), as the study and the overhead benchmark rely on."""
    argv = [
        str(toy_lm_bin),
        "--user-dir",
        "fairseq_natbias",
        *LM_TASK,
        "--cpu",
        *TINY_LM,
        "--save-dir",
        "/nonexistent/ckpt",
    ]
    explicit = [
        "--decoder-input-dim",
        "64",
        "--decoder-output-dim",
        "64",
        "--decoder-normalize-before",
    ]

    def shapes(arch, *options):
        model = build_from_training_args([*argv, "--arch", arch, *options])[2]
        return {k: v.shape for k, v in model.state_dict().items()}

    natbias = shapes("transformer_lm_natbias")
    assert natbias == shapes("transformer_lm_natbias", *explicit)
    assert "decoder.layer_norm.weight" in natbias  # pre-norm: a final layer norm
    stock_implicit = shapes("transformer_lm")
    assert "decoder.layer_norm.weight" not in stock_implicit
    assert stock_implicit["decoder.embed_tokens.weight"][1] == 512
    stock = shapes("transformer_lm", *explicit)
    extra = {
        "decoder.output_projection.bias",
        "decoder.output_projection.gain_param",
        "target_log_unigram",
    }
    assert set(natbias) - set(stock) == extra and set(stock) <= set(natbias)
    assert all(natbias[k] == shape for k, shape in stock.items())


@pytest.mark.training
def test_analysis_tools_work_on_a_language_model(lm_run, toy_lm_bin, toy_text, tmp_path):
    """natbias-step0, natbias-frequency (Fig. 4: bias kept and dropped),
    natbias-dynamics and natbias-alc on an LM run, through their CLIs."""
    import csv

    save_dir = lm_run[0]
    step0 = fairseq(
        "natbias-step0",
        toy_lm_bin,
        "--user-dir",
        "fairseq_natbias",
        "--arch",
        "transformer_lm_natbias",
        *TINY_LM,
        *LM_TASK,
        "--cpu",
        "--save-dir",
        tmp_path / "fresh",
    )
    values = json.loads(step0.stdout.strip().splitlines()[-1])
    # the unigram's cross-entropy on the validation text, counted here (JSON: 4 decimals)
    dictionary = Dictionary.load(str(toy_lm_bin / "dict.txt"))
    log_u = log_unigram_of(hand_counts(toy_text / "train.tgt", dictionary))
    valid = hand_counts(toy_text / "valid.tgt", dictionary)
    unigram_ce_bits = -(valid * log_u).sum() / valid.sum() / math.log(2)
    assert values["unigram_ce"] == pytest.approx(unigram_ce_bits, abs=5e-5)
    assert abs(values["nll"] - unigram_ce_bits) < 0.3
    fairseq(
        "examples/paper/frequency.py",
        toy_lm_bin,
        "--model",
        f"unigram={save_dir / 'checkpoint_last.pt'}",
        "--out-dir",
        tmp_path / "fig4",
    )
    with open(tmp_path / "fig4/frequency_tokens.csv") as table:
        rows = list(csv.DictReader(table))
    assert rows and any(
        abs(float(r["avg_logprob_full"]) - float(r["avg_logprob_without_bias"])) > 0.1 for r in rows
    )
    assert (tmp_path / "fig4/frequency.png").stat().st_size > 5000
    fairseq(
        "natbias-dynamics",
        "--log",
        f"unigram={save_dir / 'train.log'}",
        "--metrics",
        "kl_unigram",
        "gain",
        "valid_loss",
        "--out-dir",
        tmp_path / "dyn",
    )
    assert (tmp_path / "dyn/gain.png").exists() and (tmp_path / "dyn/valid_loss.png").exists()
    alc = fairseq("natbias-alc", save_dir / "train.log", "--metric", "loss")
    # the trapezoids under the validation losses read here (the last line of an update wins)
    curve = {int(r["num_updates"]): r["loss"] for r in log_records(lm_run[1] + lm_run[2], "valid")}
    updates = sorted(curve)
    area = sum((b - a) * (curve[a] + curve[b]) / 2 for a, b in zip(updates, updates[1:]))
    expected = f"{area / (updates[-1] - updates[0]):.4f}  over updates {updates[0]}-{updates[-1]}"
    note = f", {len(updates)} points (run stops before the limit)"  # 4 updates of 20,000
    assert f"{save_dir / 'train.log'}\t{expected}{note}" in alc.stdout.splitlines()
