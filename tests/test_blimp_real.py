"""natbias-frequency-bias on the real BLiMP (../shared/data/blimp, as distributed:
gzipped JSON lines; skipped where absent), against a computation of this test's
own: a small GPT-2 trained here on the two files' good sentences (so it reads
context), each sentence scored alone with no padding, the differing tokens,
the ranking and the thirds computed another way (np.bincount, a stable argsort).
"""

import csv
import gzip
import json
import os

import numpy as np
import pytest
import torch
from natbias_testing import REPO, fairseq, ranked_thirds

BLIMP = os.environ.get("NATBIAS_BLIMP", str(REPO.parent / "shared" / "data" / "blimp"))
# Word replacements (a subword tokenizer makes some of them added tokens), and
# a file of mostly reordered words: all three kinds of App. E's filter.
FILES = ("determiner_noun_agreement_1", "principle_A_domain_3")
PATHS = [os.path.join(BLIMP, f"{name}.jsonl.gz") for name in FILES]
# Batched scores (float32 logits, one batch of many sentences) differ from
# unbatched ones by the logits' float32 rounding: ~1e-6 a token (2^-24 of
# logits and a logsumexp of ~10), under 1e-4 over BLiMP's < 40 tokens.
LOGPROB_TOLERANCE = 1e-4

pytestmark = [
    pytest.mark.training,
    pytest.mark.skipif(
        not all(os.path.exists(p) for p in PATHS), reason=f"BLiMP is not in {BLIMP}"
    ),
]


def read_blimp(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [(item["sentence_good"], item["sentence_bad"]) for item in map(json.loads, f)]


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory):
    """A 2-layer GPT-2 and a unigram tokenizer (every encoding ending in </s>),
    trained on the good sentences of FILES; the training text's path."""
    from tokenizers import SentencePieceUnigramTokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("blimp_real")
    lines = [good for path in PATHS for good, _ in read_blimp(path)]
    train_text = root / "train.txt"
    train_text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(
        lines, vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>",
        show_progress=False,
    )  # fmt: skip
    unigram.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=unigram, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=64,
        bos_token_id=1, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    encoded = [[1, *tokenizer(line)["input_ids"]] for line in lines]  # after </s>, as scored
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = np.random.default_rng(0)
    for _ in range(150):
        batch = [torch.tensor(encoded[i]) for i in generator.choice(len(encoded), 32)]
        ids = torch.nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=0)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(b) for b in batch], True)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
        optimizer.zero_grad()
        loss.loss.backward()
        optimizer.step()
    model.eval()
    folder = root / "lm"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, model, tokenizer, lines, train_text


def expected_result(model, tokenizer, lines):
    """This test's own route: per pair whether it is kept and its relative
    difference (np.bincount of each side), each sentence's log-probability
    scored alone (float64, no padding); the kept pairs' thirds by a stable argsort."""
    vocab = model.config.vocab_size
    counts = np.bincount(
        np.concatenate([tokenizer(line)["input_ids"] for line in lines]), None, vocab
    )

    @torch.no_grad()
    def log_prob(ids):
        logits = model(torch.tensor([[1, *ids[:-1]]])).logits[0].double()
        return logits.log_softmax(-1)[torch.arange(len(ids)), torch.tensor(ids)].sum().item()

    pairs = []
    for name, path in zip(FILES, PATHS):
        for line, (good, bad) in enumerate(read_blimp(path), start=1):
            g, b = tokenizer(good)["input_ids"], tokenizer(bad)["input_ids"]
            difference = np.bincount(g, None, vocab) - np.bincount(b, None, vocab)
            good_only, bad_only = np.clip(difference, 0, None), np.clip(-difference, 0, None)
            kept = good_only.sum() > 0 and bad_only.sum() > 0
            f_good = good_only @ counts / max(good_only.sum(), 1)
            f_bad = bad_only @ counts / max(bad_only.sum(), 1)
            relative = (f_good - f_bad) / (f_good + f_bad) if f_good + f_bad else 0.0
            pairs.append(
                dict(
                    key=(name, line),
                    kept=kept,
                    relative=relative,
                    good=log_prob(g),
                    bad=log_prob(b),
                )
            )
    return (pairs, *ranked_thirds(pairs))


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_frequency_bias_on_two_blimp_files_equals_the_tests_own_computation(trained_lm, tmp_path):
    folder, model, tokenizer, lines, train_text = trained_lm
    result = fairseq(
        "natbias-frequency-bias", *PATHS, folder, "--train-text", train_text, "--cpu",
        "--csv", tmp_path / "phenomena.csv", "--out-dir", tmp_path,
    )  # fmt: skip
    pairs, kept, lower, upper = expected_result(model, tokenizer, lines)
    assert 0 < len(kept) < len(pairs)  # some of each: the filter is exercised
    skipped = len(pairs) - len(kept)
    assert (
        f"{len(kept)} replacement pairs of {len(pairs)}; {skipped} pairs skipped" in result.stdout
    )

    rows = read_csv(tmp_path / "frequency_bias.csv")
    by_key = {(row["phenomenon"], int(row["line"])): row for row in rows}
    for name in ("lower", "upper"):
        members = {key for key, row in by_key.items() if row["third"] == name}
        assert members == {p["key"] for p in (lower if name == "lower" else upper)}, name
    for pair in kept:
        row = by_key[pair["key"]]
        assert float(row["logprob_good"]) == pytest.approx(pair["good"], abs=LOGPROB_TOLERANCE)
        assert float(row["logprob_bad"]) == pytest.approx(pair["bad"], abs=LOGPROB_TOLERANCE)
        assert float(row["relative_difference"]) == pair["relative"]

    right = lambda group: float(np.mean([p["good"] > p["bad"] for p in group]))  # noqa: E731
    phenomena = {row["phenomenon"]: row for row in read_csv(tmp_path / "phenomena.csv")}
    assert list(phenomena) == [*FILES, "all"]
    for name in FILES:
        assert float(phenomena[name]["blimp_score"]) == right(
            [p for p in pairs if p["key"][0] == name]
        )
    overall = phenomena["all"]
    assert float(overall["blimp_score"]) == np.mean(
        [float(phenomena[n]["blimp_score"]) for n in FILES]
    )
    assert int(overall["kept"]) == len(kept)
    assert int(overall["lower_pairs"]) == int(overall["upper_pairs"]) == len(kept) // 3
    assert float(overall["lower_score"]) == right(lower)
    assert float(overall["upper_score"]) == right(upper)
    assert f"frequency bias (upper - lower): {right(upper) - right(lower):+.4f}" in result.stdout
