"""research/bench_bigram.py: its counting path (a synthetic split written
with fairseq's builder, counted by the package in a child process with small
chunks and merge thresholds) against a count made here, sentence by sentence
through fairseq's own reader."""

from collections import Counter

import numpy as np
import pytest
from research_scripts import benchmark_script

VOCAB, EOS = 32_000, 2


@pytest.fixture(scope="module")
def script():
    return benchmark_script("bench_bigram")


def hand_count(prefix):
    """Unigram and (previous, next) pair counts of a binarised split, the
    stream starting after EOS, read with fairseq's MMapIndexedDataset."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    unigrams, pairs, previous = Counter(), Counter(), EOS
    dataset = MMapIndexedDataset(str(prefix))
    for i in range(len(dataset)):
        sentence = dataset[i].tolist()
        assert sentence[-1] == EOS and EOS not in sentence[:-1]
        for token in sentence:
            unigrams[token] += 1
            pairs[previous, token] += 1
            previous = token
    return unigrams, pairs


def test_quick_counting_matches_a_count_made_here(script, tmp_path):
    prefix = tmp_path / "train.de-en.en"
    tokens, _ = script.write_split(prefix, 8_000, VOCAB, seed=3)
    saved = tmp_path / "table.npz"
    # 4,096-token chunks, a merge every 1,024 pending pairs: seams and merges
    figures = script.run_child(
        prefix, VOCAB, with_pairs=True, save=saved, chunk=4_096, pending=1_024
    )
    unigrams, pairs = hand_count(prefix)
    assert figures["tokens"] == tokens == sum(unigrams.values())
    assert figures["pairs"] == len(pairs)
    assert figures["rows_equal_unigram"] and figures["columns_equal_unigram"]
    table = np.load(saved)
    assert dict(enumerate(table["unigram"].tolist())) == {
        t: unigrams.get(t, 0) for t in range(VOCAB)
    }
    assert script.table_as_counter(table) == pairs
    # the corpus is the one the docstring describes: Zipfian ids of the
    # vocabulary's words, sentences of 10..46 tokens plus EOS
    assert min(t for t in unigrams if t != EOS) >= 4 and max(unigrams) < VOCAB
    assert unigrams[4] > unigrams[5] > unigrams[100]
    assert 10 * 8_000 < tokens - unigrams[EOS] <= 46 * 8_000 and unigrams[EOS] == 8_000
    # the script's own check agrees, and catches one count off
    verdict = script.check_against_independent(saved, prefix)
    assert verdict["unigram_equal"] and verdict["pairs_equal"]
    counts = table["counts"].copy()
    counts[len(counts) // 2] += 1
    np.savez(
        tmp_path / "off.npz",
        indptr=table["indptr"],
        indices=table["indices"],
        counts=counts,
        unigram=table["unigram"],
    )
    assert not script.check_against_independent(tmp_path / "off.npz", prefix)["pairs_equal"]
