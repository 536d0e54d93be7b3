"""benchmarks/bigram_smoothing.py: the priors' cross-entropies against the
bigram formulas written out here, pair by pair, and the script run on real
binarised data (a translation target side and a language-model stream)."""

import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from natbias_testing import REPO, benchmark_script
from fairseq_natbias.bigram import PairCounter

V, EOS = 7, 2


@pytest.fixture(scope="module")
def script():
    return benchmark_script("bigram_smoothing")


def stream_pairs(tokens):
    previous, pairs = EOS, Counter()
    for token in tokens:
        pairs[previous, token] += 1
        previous = token
    return pairs


def by_formula(train_pairs, p, d=None):
    """p(y | v) written out: Witten-Bell (d None) or interpolated absolute
    discounting; the unigram p alone for a context never seen."""
    def prob(v, y):
        row = {y2: c for (v2, y2), c in train_pairs.items() if v2 == v}
        total, distinct = sum(row.values()), len(row)
        if not total:
            return p[y]
        if d is None:
            lam = total / (total + distinct)
            return lam * row.get(y, 0) / total + (1 - lam) * p[y]
        return max(row.get(y, 0) - d, 0) / total + d * distinct / total * p[y]
    return prob


def test_cross_entropies_equal_the_bigram_formulas(script):
    train = [4, 5, 6, 2, 4, 5, 2, 4, 6, 6, 5, 2, 3, 4, 5, 2]
    held_out = [4, 5, 2, 6, 4, 2, 3, 3, 5, 2]  # unseen pairs and a context seen once
    counter, targets = PairCounter(V, EOS), PairCounter(V, EOS)
    counter.add(np.array(train))
    targets.add(np.array(held_out))
    table, held = counter.table(), targets.table()
    counts = np.bincount(train, minlength=V)
    p = (counts + 1) / (counts + 1).sum()
    residuals = script.residuals(table, np.log(p))
    n1 = sum(1 for c in stream_pairs(train).values() if c == 1)
    n2 = sum(1 for c in stream_pairs(train).values() if c == 2)
    d_kn = n1 / (n1 + 2 * n2)
    expected = {"unigram": lambda v, y: p[y], "witten-bell": by_formula(stream_pairs(train), p),
                f"discount d_KN = {d_kn:.3f}": by_formula(stream_pairs(train), p, d_kn),
                "discount 1": by_formula(stream_pairs(train), p, 1.0)}
    for name, prob in expected.items():
        for tokens, pairs in ((held_out, held), (train, table)):
            by_hand = -sum(c * math.log2(prob(v, y)) for (v, y), c in
                           stream_pairs(tokens).items()) / len(tokens)
            assert script.cross_entropy(table, residuals[name][1], np.log(p), pairs) == \
                pytest.approx(by_hand, abs=1e-9), name


def test_leave_one_out_scores_each_training_pair_without_itself(script):
    train = [4, 5, 6, 2, 4, 5, 2, 4, 6, 6, 5, 2, 3, 4, 5, 2]
    counter = PairCounter(V, EOS)
    counter.add(np.array(train))
    counts = np.bincount(train, minlength=V)
    p = (counts + 1) / (counts + 1).sum()
    pairs = stream_pairs(train)
    for d in (None, 0.5, 1.0):
        bits = 0.0
        for (v, y), c in pairs.items():
            without = pairs.copy()
            without[v, y] -= 1  # this occurrence held out; the rest as counted
            without = Counter({k: n for k, n in without.items() if n > 0})
            bits -= c * math.log2(by_formula(without, p, d)(v, y))
        assert script.leave_one_out(counter.table(), np.log(p), d) == \
            pytest.approx(bits / len(train), abs=1e-9), d


def test_the_screen_runs_on_a_translation_target_and_a_language_model(toy_bin, toy_lm_bin,
                                                                     tmp_path):
    out = tmp_path / "smoothing.md"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bigram_smoothing.py"),
         f"{toy_bin}:src-tgt", f"{toy_lm_bin}:lm", "--out", str(out)],
        capture_output=True, text=True, check=True)
    rows = [line.split("|") for line in out.read_text().splitlines()
            if line.startswith("|") and ("witten-bell" in line or "unigram" in line)]
    assert len(rows) == 4 and "bits per target token" in out.read_text()
    for row in rows:
        held_out, in_sample = float(row[4]), float(row[5])
        assert 0 < in_sample and 0 < held_out
    assert "witten-bell" in done.stdout
