"""natbias-loss-by-frequency and natbias-frequency-bias on models whose
probabilities are known: a natural-bias model with W = 0 predicts its output
bias, the smoothed training unigram, in every context; with b = 0 as well it
predicts the uniform distribution. Every number is checked against one
computed here from the text (training counts, per-token losses, medians,
Kobayashi et al.'s KL, BLiMP thirds). fairseq (translation and language
model checkpoints, trained one update) and transformers (GPT-2, built)."""

import csv
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from natbias_testing import fairseq, train, train_lm

from fairseq_natbias import checkpoint_loading  # noqa: F401  (torch.load of fairseq's checkpoints)

EDGES = ["1", "20", "100"]  # bins 1-19, 20-99, >=100 (with EOS counted, the toy's top types)


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def counted(lines, eos="</s>"):
    """Each line's tokens (split at spaces) and an EOS, counted."""
    counts = Counter()
    for line in lines:
        counts.update(line.split() + [eos])
    return counts


def unigram_and_uniform(checkpoint, root):
    """The checkpoint with W = 0 (predicts b, the frozen log-unigram) and with W = b = 0."""
    state = torch.load(checkpoint, map_location="cpu")
    for key in ("decoder.output_projection.weight", "decoder.embed_tokens.weight"):
        state["model"][key].zero_()  # the embeddings too, in case the two are tied
    torch.save(state, root / "unigram.pt")
    state["model"]["decoder.output_projection.bias"].zero_()
    torch.save(state, root / "uniform.pt")
    return root / "uniform.pt", root / "unigram.pt"


@pytest.fixture(scope="module")
def translation_models(toy_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("by_frequency_mt")
    train(toy_bin, root / "run", "--natbias-init", "unigram", "--natbias-freeze", max_update=1)
    return unigram_and_uniform(root / "run" / "checkpoint_last.pt", root)


@pytest.fixture(scope="module")
def lm_models(toy_lm_bin, tmp_path_factory):
    root = tmp_path_factory.mktemp("by_frequency_lm")
    train_lm(
        toy_lm_bin, root / "run", "--natbias-init", "unigram", "--natbias-freeze", max_update=1
    )
    return unigram_and_uniform(root / "run" / "checkpoint_last.pt", root)


def expected_bins(test_lines, train_counts, vocab, edges):
    """Per bin of EDGES: tokens, median and mean of loss(unigram) - loss(uniform), in bits."""
    total = sum(train_counts.values()) + vocab  # add-1 smoothing over the vocabulary
    differences = {}
    for token in [t for line in test_lines for t in line.split() + ["</s>"]]:
        count = train_counts[token]
        if count < edges[0]:
            continue
        k = max(i for i, low in enumerate(edges) if count >= low)
        loss_unigram = -math.log2((count + 1) / total)
        differences.setdefault(k, []).append(loss_unigram - math.log2(vocab))
    return {k: (len(d), float(np.median(d)), float(np.mean(d))) for k, d in differences.items()}


def kl_uniform_from_unigram(train_counts, symbols):
    """KL(uniform || add-1 unigram) in bits over ``symbols`` (the dictionary)."""
    total = sum(train_counts.values()) + len(symbols)
    return sum(
        math.log2((1 / len(symbols)) / ((train_counts[s] + 1) / total)) for s in symbols
    ) / len(symbols)


def check_loss_output(result, out, test_lines, train_counts, symbols):
    edges = [int(e) for e in EDGES]
    expected = expected_bins(test_lines, train_counts, len(symbols), edges)
    rows = read_csv(out / "loss_by_frequency.csv")
    assert [r["bin"] for r in rows] == ["1-19", "20-99", ">=100"]
    for k, row in enumerate(rows):
        n, median, mean = expected.get(k, (0, None, None))
        assert int(row["tokens"]) == n
        if n:
            assert float(row["median_difference_bits"]) == pytest.approx(median, abs=1e-4)
            assert float(row["mean_difference_bits"]) == pytest.approx(mean, abs=1e-4)
            assert row["few"] == str(n < 30)
    assert sum(n for n, _, _ in expected.values()) > 50
    assert (out / "loss_by_frequency.png").stat().st_size > 0
    kl = kl_uniform_from_unigram(train_counts, symbols)
    (baseline,) = [line for line in result.stdout.splitlines() if line.startswith("baseline ")]
    (model,) = [line for line in result.stdout.splitlines() if line.startswith("model ")]
    assert f"{math.log2(len(symbols)):.4f} bits a token" in baseline
    assert f"KL(average prediction || training unigram) {kl:.4f} bits" in baseline
    assert "KL(average prediction || training unigram) 0.0000 bits" in model


def fairseq_symbols(data, name):
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(data / name))
    return [dictionary[i] for i in range(len(dictionary))]


@pytest.mark.training
@pytest.mark.parametrize("task", ["translation", "language_modeling"])
def test_loss_by_frequency_of_fairseq_models_with_known_probabilities(
    task, translation_models, lm_models, toy_bin, toy_lm_bin, toy_text, tmp_path
):
    models, data, dict_name = {
        "translation": (translation_models, toy_bin, "dict.tgt.txt"),
        "language_modeling": (lm_models, toy_lm_bin, "dict.txt"),
    }[task]
    result = fairseq(
        "natbias-loss-by-frequency", *models, "--data", data, "--cpu",
        "--edges", *EDGES, "--out-dir", tmp_path,
    )  # fmt: skip
    train_counts = counted((toy_text / "train.tgt").read_text().splitlines())
    test_lines = (toy_text / "test.tgt").read_text().splitlines()
    check_loss_output(result, tmp_path, test_lines, train_counts, fairseq_symbols(data, dict_name))


def blimp_pairs(train_counts):
    """Pairs that replace one word: three where the good sentence has the
    frequent word, three where the bad one has, three between neighbours in
    frequency; one reordered and one with a word added (skipped)."""
    words = sorted((w for w in train_counts if w.startswith("t")), key=train_counts.get)
    frequent, rare = words[-3:], words[:3]
    middle = words[len(words) // 2 - 3 : len(words) // 2 + 3]
    pairs = [(f"t0 {f} t1", f"t0 {r} t1") for f, r in zip(frequent, rare)]
    pairs += [(f"t2 {r} t3", f"t2 {f} t3") for f, r in zip(frequent, rare)]
    pairs += [(f"{a} t4", f"{b} t4") for a, b in zip(middle[::2], middle[1::2])]
    pairs += [("t5 t6 t7", "t6 t5 t7"), ("t5 t6", "t5 t6 t6")]
    return pairs


def write_pairs(path, pairs):
    path.write_text(
        "".join(json.dumps({"sentence_good": g, "sentence_bad": b}) + "\n" for g, b in pairs)
    )
    return path


def check_bias_output(result, out, pairs, train_counts, vocab):
    """The unigram model is right exactly where the good word is the more frequent."""
    lines = result.stdout.splitlines()
    assert (
        "9 replacement pairs of 11; 2 pairs skipped as no replacement (1 added, 1 reordered)"
        in lines
    )
    assert "lower third (3 pairs, bad sentence's tokens more frequent): 0.0000" in lines
    assert "upper third (3 pairs, good sentence's tokens more frequent): 1.0000" in lines
    assert "frequency bias (upper - lower): +1.0000" in lines
    total = sum(train_counts.values()) + vocab
    log_u = lambda sentence: sum(  # noqa: E731
        math.log((train_counts[t] + 1) / total) for t in sentence.split() + ["</s>"]
    )
    rows = {int(r["line"]): r for r in read_csv(out / "frequency_bias.csv")}
    assert sorted(rows) == list(range(1, 10))
    for line, (good, bad) in enumerate(pairs[:9], start=1):
        row = rows[line]
        assert float(row["logprob_good"]) == pytest.approx(log_u(good), abs=1e-4)
        assert float(row["logprob_bad"]) == pytest.approx(log_u(bad), abs=1e-4)
        g, b = (train_counts[s.split()[0 if line > 6 else 1]] for s in (good, bad))
        assert row["correct"] == str(g > b)
        assert float(row["relative_difference"]) == pytest.approx((g - b) / (g + b))
    assert {rows[i]["third"] for i in (1, 2, 3)} == {"upper"}
    assert {rows[i]["third"] for i in (4, 5, 6)} == {"lower"}


@pytest.mark.training
def test_frequency_bias_of_a_fairseq_unigram_language_model(
    lm_models, toy_lm_bin, toy_text, tmp_path
):
    train_counts = counted((toy_text / "train.tgt").read_text().splitlines())
    pairs = blimp_pairs(train_counts)
    result = fairseq(
        "natbias-frequency-bias", write_pairs(tmp_path / "pairs.jsonl", pairs), lm_models[1],
        "--data", toy_lm_bin, "--cpu", "--out-dir", tmp_path,
    )  # fmt: skip
    vocab = len(fairseq_symbols(toy_lm_bin, "dict.txt"))
    check_bias_output(result, tmp_path, pairs, train_counts, vocab)


# --- transformers --------------------------------------------------------------------


def gpt2_folder(folder, words, counts=None):
    """A GPT-2 of hf_tiny's sizes, W = 0, with a word-level tokenizer over
    ``words`` (every encoding ending in </s>): uniform, or with ``counts`` the
    natural bias, predicting their add-1 unigram."""
    from hf_tiny import build, word_level_tokenizer

    from natbias.hf import add_natural_bias

    tokenizer, names = word_level_tokenizer(words)
    model = build("gpt2")
    if counts is not None:
        model = add_natural_bias(model, counts=[counts[name] for name in names])
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, names


@pytest.fixture(scope="module")
def hf_models(toy_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("by_frequency_hf")
    train_counts = counted((toy_text / "train.tgt").read_text().splitlines())
    words = sorted(w for w in train_counts if w.startswith("t"))
    uniform, names = gpt2_folder(root / "uniform", words)
    unigram, _ = gpt2_folder(root / "unigram", words, train_counts)
    return uniform, unigram, names, train_counts


def test_loss_by_frequency_of_transformers_models_with_known_probabilities(
    hf_models, toy_text, tmp_path
):
    uniform, unigram, names, train_counts = hf_models
    result = fairseq(
        "natbias-loss-by-frequency", uniform, unigram, "--text", toy_text / "test.tgt",
        "--train-text", toy_text / "train.tgt", "--cpu", "--edges", *EDGES, "--out-dir", tmp_path,
    )  # fmt: skip
    test_lines = (toy_text / "test.tgt").read_text().splitlines()
    check_loss_output(result, tmp_path, test_lines, train_counts, names)


def test_frequency_bias_of_a_transformers_unigram_model(hf_models, toy_text, tmp_path):
    _, unigram, names, train_counts = hf_models
    pairs = blimp_pairs(train_counts)
    result = fairseq(
        "natbias-frequency-bias", write_pairs(tmp_path / "pairs.jsonl", pairs), unigram,
        "--train-text", toy_text / "train.tgt", "--cpu", "--out-dir", tmp_path,
    )  # fmt: skip
    check_bias_output(result, tmp_path, pairs, train_counts, len(names))


def test_models_of_different_dictionaries_are_refused_in_one_line(hf_models, toy_text, tmp_path):
    uniform, _, _, train_counts = hf_models
    other, _ = gpt2_folder(tmp_path / "other", sorted(w for w in train_counts if w != "</s>")[::-1])
    result = fairseq(
        "natbias-loss-by-frequency", uniform, other, "--text", toy_text / "test.tgt",
        "--train-text", toy_text / "train.tgt", "--out-dir", tmp_path / "out", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("natbias-loss-by-frequency: error: models of different dictionaries: ")


@pytest.mark.training
def test_bin_edges_out_of_order_are_refused_before_a_model_is_read(
    translation_models, toy_bin, tmp_path
):
    result = fairseq(
        "natbias-loss-by-frequency", *translation_models, "--data", toy_bin,
        "--edges", "50", "1", "--out-dir", tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "natbias-loss-by-frequency: error: bin edges out of order: 50 1; give strictly "
        "increasing lower bounds (e.g. 1 51 101)"
    ]


def test_pairs_that_replace_nothing_are_counted_and_refused_in_one_line(
    hf_models, toy_text, tmp_path
):
    _, unigram, _, _ = hf_models
    pairs = [("t5 t6 t7", "t6 t5 t7"), ("t5 t6", "t5 t6 t6"), ("t1 t2", "t1 t3")]
    result = fairseq(
        "natbias-frequency-bias", write_pairs(tmp_path / "pairs.jsonl", pairs), unigram,
        "--train-text", toy_text / "train.tgt", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "natbias-frequency-bias: error: 1 replacement pairs left of 3 (2 pairs skipped as no "
        "replacement (1 added, 1 reordered)): ranking into thirds needs at least 3"
    ]


@pytest.mark.training
def test_a_checkpoint_of_another_dictionary_is_refused_in_one_line(
    translation_models, toy_bin, tmp_path
):
    state = torch.load(translation_models[0], map_location="cpu")
    for key in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        state["model"][key] = torch.cat([state["model"][key], state["model"][key][:4]])
    torch.save(state, tmp_path / "other.pt")
    result = fairseq(
        "natbias-loss-by-frequency", translation_models[0], tmp_path / "other.pt",
        "--data", toy_bin, "--out-dir", tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("natbias-loss-by-frequency: error: mismatched dictionaries: ")
    assert "trained with a target dictionary of" in line


@pytest.mark.training
def test_output_frequency_of_fairseq_generate_on_a_checkpoint(
    translation_models, toy_bin, toy_text, tmp_path
):
    """fairseq-generate's own output (the unigram model: it repeats the most
    frequent words) and natbias-count's counts file; the tokens counted here."""
    from natbias_testing import NO_LOADER_PROCESS

    generated = fairseq(
        "fairseq-generate", *NO_LOADER_PROCESS, toy_bin, "--path", translation_models[1],
        "--user-dir", "fairseq_natbias", "--beam", "2", "--max-len-b", "5", "--batch-size", "8",
    ).stdout  # fmt: skip
    (tmp_path / "gen.txt").write_text(generated, encoding="utf-8")
    fairseq(
        "natbias-count", "--dict", toy_bin / "dict.tgt.txt", "--data", toy_bin,
        "--source-lang", "src", "--target-lang", "tgt", "--output", tmp_path / "train.counts",
    )  # fmt: skip
    fairseq(
        "natbias-output-frequency", tmp_path / "gen.txt", "--counts", tmp_path / "train.counts",
        "--edges", *EDGES, "--out-dir", tmp_path / "out",
    )  # fmt: skip
    train_counts = counted((toy_text / "train.tgt").read_text().splitlines())
    produced, reference = Counter(), Counter()
    for line in generated.splitlines():
        kind, _, rest = line.partition("\t")
        if kind.startswith("H-"):
            produced.update(rest.split("\t")[1].split())
        elif kind.startswith("T-"):
            reference.update(rest.split())
    test_lines = (toy_text / "test.tgt").read_text().splitlines()
    assert reference == Counter(
        word
        for line in generated.splitlines()
        if line.startswith("T-")
        for word in test_lines[int(line.partition("\t")[0][2:])].split()
    )
    rows = read_csv(tmp_path / "out" / "output_frequency.csv")
    bins = [(1, 20), (20, 100), (100, 10**9)]
    for row, (low, high) in zip(rows, bins):
        expected = [
            sum(n for t, n in c.items() if low <= train_counts[t] < high)
            for c in (produced, reference)
        ]
        assert [int(row["produced"]), int(row["reference"])] == expected
    assert sum(int(r["produced"]) for r in rows) == sum(produced.values()) > 0


@pytest.mark.training
def test_a_translation_model_or_no_model_for_the_frequency_bias_is_refused_in_one_line(
    translation_models, toy_bin, hf_models, tmp_path
):
    pairs = write_pairs(tmp_path / "pairs.jsonl", [("t1 t2", "t1 t3")] * 3)
    for model, message in (
        (translation_models[1], f"{translation_models[1]} is a translation model"),
        (tmp_path / "missing.pt", f"{tmp_path / 'missing.pt'}: no such checkpoint file"),
    ):
        result = fairseq("natbias-frequency-bias", pairs, model, "--data", toy_bin, check=False)
        assert result.returncode != 0
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"natbias-frequency-bias: error: {message}")


def test_a_start_token_the_tokenizer_puts_first_is_context(hf_models):
    """A tokenizer that opens with <s> (the model's BOS): not a token to predict."""
    from natbias.hf import scoring

    uniform, _, names, _ = hf_models
    model, tokenizer = scoring.load_causal_lm(str(uniform))
    assert scoring.encode(tokenizer, model, ["t1 t2"]) == [
        [names.index("t1"), names.index("t2"), 1]
    ]
    assert scoring.encode(tokenizer, model, ["<s> t1"]) == [[names.index("t1"), 1]]


def test_output_frequency_of_plain_hypotheses_and_references(toy_text, tmp_path):
    """natbias-output-frequency --hypotheses --references --train-text (the
    documented plain-text form): each bin's tokens produced and in the
    references, and their ratio, counted here from the three texts; unequal
    line counts refused in one line."""
    references = (toy_text / "test.tgt").read_text().splitlines()
    train_counts = Counter((toy_text / "train.tgt").read_text().split())  # no EOS: plain text
    top = train_counts.most_common(1)[0][0]
    hypotheses = [" ".join(line.split()[::-2] + [top, top]) for line in references]
    (tmp_path / "hyp.txt").write_text("".join(h + "\n" for h in hypotheses))
    result = fairseq(
        "natbias-output-frequency", "--hypotheses", tmp_path / "hyp.txt",
        "--references", toy_text / "test.tgt", "--train-text", toy_text / "train.tgt",
        "--edges", *EDGES, "--out-dir", tmp_path / "out",
    )  # fmt: skip
    produced = Counter(t for line in hypotheses for t in line.split())
    reference = Counter(t for line in references for t in line.split())
    summary = f"{sum(produced.values())} tokens produced, {sum(reference.values())} in the "
    assert summary + f"references, {len(references)} sentences" in result.stdout.splitlines()
    rows = read_csv(tmp_path / "out" / "output_frequency.csv")
    assert [r["bin"] for r in rows] == ["1-19", "20-99", ">=100"]
    for row, (low, high) in zip(rows, [(1, 20), (20, 100), (100, math.inf)]):
        n_produced, n_reference = (
            sum(n for t, n in counts.items() if low <= train_counts[t] < high)
            for counts in (produced, reference)
        )
        assert (int(row["produced"]), int(row["reference"])) == (n_produced, n_reference)
        if n_reference:
            assert float(row["ratio"]) == pytest.approx(n_produced / n_reference)
    assert float(rows[-1]["ratio"]) > 1  # the most frequent word over-produced
    (tmp_path / "short.txt").write_text("".join(h + "\n" for h in hypotheses[:-1]))
    refused = fairseq(
        "natbias-output-frequency", "--hypotheses", tmp_path / "short.txt",
        "--references", toy_text / "test.tgt", "--train-text", toy_text / "train.tgt",
        "--out-dir", tmp_path / "out2", check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"natbias-output-frequency: error: {len(references) - 1} hypotheses, "
        f"{len(references)} references: give one of each a line"
    ]
