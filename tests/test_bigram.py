"""fairseq_natbias.bigram: pair counts and the Witten-Bell residual table,
checked against counts and probabilities computed here by hand."""

import math
from collections import Counter

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary

from natbias import bigram, prior
from natbias import counts as natbias_counts


def hand_pairs(text_path, dictionary):
    """(previous, next) counts of the binarised target stream, counted here:
    every line's words as the dictionary maps them, then EOS; the first token
    of the file follows EOS."""
    pairs, previous = Counter(), dictionary.eos()
    for line in text_path.read_text(encoding="utf-8").splitlines():
        for token in [dictionary.index(w) for w in line.split()] + [dictionary.eos()]:
            pairs[previous, token] += 1
            previous = token
    return pairs


def csr_row(table, previous):
    """Row ``previous`` of a CSR table: its seen continuations and their counts."""
    span = slice(table.indptr[previous], table.indptr[previous + 1])
    return table.indices[span], table.counts[span]


def witten_bell(pairs, p):
    """p_WB(. | v) for every v, straight from the interpolation formula:
    lam c(v, y) / c(v) + (1 - lam) p(y), lam = c(v) / (c(v) + T(v))."""
    rows = np.tile(p, (len(p), 1))
    totals, distinct = Counter(), Counter()
    for (v, _), c in pairs.items():
        totals[v] += c
        distinct[v] += 1
    for v in totals:
        lam = totals[v] / (totals[v] + distinct[v])
        rows[v] = (1 - lam) * p
    for (v, y), c in pairs.items():
        lam = totals[v] / (totals[v] + distinct[v])
        rows[v, y] += lam * c / totals[v]
    return rows


def dense(table, vocab):
    indptr, indices, values = table
    matrix = np.zeros((vocab, vocab))
    for v in range(vocab):
        span = slice(int(indptr[v]), int(indptr[v + 1]))
        matrix[v, indices[span].numpy()] = values[span].double().numpy()
    return matrix


@pytest.mark.parametrize(
    "chunk, pending", [(natbias_counts.CHUNK_TOKENS, bigram.MIN_PENDING_PAIRS), (7, 5)]
)  # chunk seams and many merges
def test_pairs_counted_in_the_unigram_pass_match_a_hand_count(
    toy_text, toy_bin, monkeypatch, chunk, pending
):
    monkeypatch.setattr(natbias_counts, "CHUNK_TOKENS", chunk)
    monkeypatch.setattr(bigram, "MIN_PENDING_PAIRS", pending)
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    counter = bigram.PairCounter(len(dictionary), dictionary.eos())
    counts = natbias_counts.count_binarised(
        str(toy_bin / "train.src-tgt.tgt"), len(dictionary), pairs=counter
    )
    table = counter.table()
    expected = hand_pairs(toy_text / "train.tgt", dictionary)
    got = {(v, int(y)): int(c) for v in range(len(dictionary)) for y, c in zip(*csr_row(table, v))}
    assert got == dict(expected)
    assert table.counts.sum() == counts.sum()  # one pair per counted token
    for v in range(len(dictionary)):  # CSR rows ascending
        assert np.all(np.diff(csr_row(table, v)[0]) > 0)


def test_residual_table_gives_the_witten_bell_bigram_hand_worked():
    # Stream (EOS = 0): a b a c EOS b b  over V = {EOS, a=1, b=2, c=3}.
    stream = np.array([1, 2, 1, 3, 0, 2, 2])
    counter = bigram.PairCounter(4, eos=0)
    counter.add(stream[:3])
    counter.add(stream[3:])
    pairs = counter.table()
    # Seen: (0,1) (1,2) (2,1) (1,3) (3,0) (0,2) (2,2): row 1 has c=2, T=2.
    assert list(csr_row(pairs, 1)[0]) == [2, 3] and list(csr_row(pairs, 1)[1]) == [1, 1]
    p = np.array([0.1, 0.3, 0.4, 0.2])
    indptr, indices, values = bigram.witten_bell_residual(pairs, torch.tensor(np.log(p)))
    # By hand: D[1, 2] = log(1 + 1 / (2 * 0.4)), D[1, 3] = log(1 + 1 / (2 * 0.2)).
    row = {
        int(y): float(d)
        for y, d in zip(indices[indptr[1] : indptr[2]], values[indptr[1] : indptr[2]])
    }
    assert row == pytest.approx({2: math.log(1 + 1 / 0.8), 3: math.log(1 + 1 / 0.4)}, rel=1e-6)
    # softmax(log p + D[v]) is p_WB(. | v) for every v, seen or not.
    reference = witten_bell(
        Counter({(v, y): 1 for v, y in [(0, 1), (1, 2), (2, 1), (1, 3), (3, 0), (0, 2), (2, 2)]}), p
    )
    logits = torch.tensor(np.log(p) + dense((indptr, indices, values), 4))
    np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), reference, atol=1e-6)


def test_residual_of_real_counts_is_the_witten_bell_bigram(toy_text, toy_bin):
    dictionary = Dictionary.load(str(toy_bin / "dict.tgt.txt"))
    counter = bigram.PairCounter(len(dictionary), dictionary.eos())
    counts = natbias_counts.count_binarised(
        str(toy_bin / "train.src-tgt.tgt"), len(dictionary), pairs=counter
    )
    log_p = prior.log_unigram(counts, 1.0)
    table = bigram.witten_bell_residual(counter.table(), log_p)
    assert (table[2] >= 0).all()
    reference = witten_bell(
        hand_pairs(toy_text / "train.tgt", dictionary), np.exp(log_p.double().numpy())
    )
    logits = torch.tensor(log_p.double().numpy() + dense(table, len(dictionary)))
    np.testing.assert_allclose(torch.softmax(logits, -1).numpy(), reference, rtol=1e-5, atol=1e-7)
