"""Which bigram table should ``--natbias-order 2`` add? A screen without
training: the cross-entropy of each candidate prior on the validation
targets (held out) and on the training targets it was counted on (in
sample), for corpora of the sizes the studies train on (issue 39).

Why: order 2 with the Witten-Bell table overfits on a small corpus (3,000
Multi30k pairs: its training NLL 0.4-0.5 bits below order 1's while its best
validation NLL is 0.23-0.27 bits worse, docs/studies/bigram.md). The table
is counted on the very targets the network is trained on, so on them it is
an in-sample fit; the gap between its in-sample and held-out cross-entropy
is the optimism the network can learn to lean on. A discounted table
shrinks the pairs seen once or twice, where that optimism lives.

The priors, each ``log p(y | v) = log p(y) + D[v, y] - log Z(v)`` with p the
model's add-one unigram (its bias at the start) and D >= 0 on seen pairs
only, as ``--natbias-order 2`` stores it:

``unigram``           D = 0: order 1's start.
``witten-bell``       D = log(1 + c(v, y) / (T(v) p(y))): the package's table
                      (``bigram.witten_bell_values``, before its float32 cast).
``discount d``        interpolated absolute discounting (Ney et al., 1994),
                      the lower order being the model's own unigram p:
                      p_d(y | v) = max(c(v, y) - d, 0) / c(v) + d T(v) / c(v) p(y),
                      so D = log(1 + max(c(v, y) - d, 0) / (d T(v) p(y))).
                      d = 1 drops every pair seen once (its count "held out"
                      by one, as leave-one-out would); ``d_KN`` is Kneser-Ney's
                      estimate n1 / (n1 + 2 n2) (n_k: pairs seen k times).

Z(v) = sum_y p(y) exp(D[v, y]) is computed from the table itself, not from
the closed forms, so the figures also check them (Witten-Bell's Z(v) is
1 / (1 - lam(v))). Counting is the package's own (``unigram`` and
``bigram.PairCounter``, the same pass a model's build makes). Cross-entropy
in bits per target token.

    .venv/bin/python benchmarks/bigram_smoothing.py /work/study/de-en_n3000/data-bin:de-en \\
        /work/study/lm-en/data-bin:lm --out benchmarks/results/bigram_smoothing.md

Each argument is DATA_BIN:de-en (translation, the target side) or
DATA_BIN:lm (fairseq's language_modeling stream).
"""

import argparse
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairseq_natbias import unigram  # noqa: E402
from fairseq_natbias.bigram import PairCounter, witten_bell_values  # noqa: E402

EOS = 2  # fairseq's Dictionary: <s> 0, <pad> 1, </s> 2, <unk> 3
FIXED_DISCOUNTS = (0.5, 0.75, 1.0)


def dictionary_size(path: str) -> int:
    """Entries of fairseq's Dictionary loaded from ``path`` (a dict.txt): its
    four specials and one per line (the file already holds preprocess's padding)."""
    with open(path, encoding="utf-8") as handle:
        return 4 + sum(1 for _ in handle)


def count(data_bin: str, kind: str, split: str):
    """Unigram counts and the pair table of one split's targets."""
    if kind == "lm":
        vocab = dictionary_size(os.path.join(data_bin, "dict.txt"))
        pairs = PairCounter(vocab, EOS)
        counts = unigram.count_lm_targets(data_bin, split, vocab, pairs=pairs)
    else:
        source, target = kind.split("-")
        vocab = dictionary_size(os.path.join(data_bin, f"dict.{target}.txt"))
        pairs = PairCounter(vocab, EOS)
        counts = unigram.count_target_tokens(data_bin, split, source, target, vocab, pairs=pairs)
    return counts, pairs.table()


def residuals(table, log_p: np.ndarray):
    """``{name: (d, D)}`` for every candidate: D aligned with table.indices,
    d the discount (None for Witten-Bell, 0 for the unigram's D = 0)."""
    distinct = np.diff(table.indptr)
    T = np.repeat(distinct, distinct).astype(np.float64)
    c = table.counts.astype(np.float64)
    p = np.exp(log_p[table.indices])
    n1, n2 = int((table.counts == 1).sum()), int((table.counts == 2).sum())
    d_kn = n1 / (n1 + 2 * n2)
    out = {"unigram": (0.0, np.zeros_like(c)),
           "witten-bell": (None, witten_bell_values(table, log_p))}
    for d, label in [(d_kn, f"discount d_KN = {d_kn:.3f}"),
                     *[(d, f"discount {d:g}") for d in FIXED_DISCOUNTS]]:
        out[label] = (d, np.log1p(np.maximum(c - d, 0.0) / (d * T * p)))
    return out


def cross_entropy(table, residual: np.ndarray, log_p: np.ndarray, targets) -> float:
    """Bits per token of the prior ``p(y) exp(D[v, y]) / Z(v)`` on the pairs of
    ``targets`` (a BigramCounts), looked up in ``table``."""
    V = table.vocab_size
    p = np.exp(log_p)
    rows = np.repeat(np.arange(V), np.diff(table.indptr))
    log_z = np.log1p(np.bincount(rows, weights=p[table.indices] * np.expm1(residual),
                                 minlength=V))
    table_keys = rows * V + table.indices  # ascending: CSR rows, sorted columns
    target_rows = np.repeat(np.arange(V), np.diff(targets.indptr))
    keys = target_rows * V + targets.indices
    where = np.searchsorted(table_keys, keys).clip(max=len(table_keys) - 1)
    seen = table_keys[where] == keys
    d = np.where(seen, residual[where], 0.0)
    log_q = log_p[targets.indices] + d - log_z[target_rows]
    return float(-(targets.counts * log_q).sum() / targets.counts.sum() / math.log(2))


def leave_one_out(table, log_p: np.ndarray, d=None) -> float:
    """Bits per training token when each training pair is scored by the
    table counted without it: c(v, y), c(v) and (for a pair seen once) T(v)
    each one less; a context left with no count falls back to p. An estimate
    of the held-out cross-entropy from the training data alone, and what a
    table fitted out-of-sample would give the network in training. Witten-Bell
    (``d`` None) or absolute discounting with ``d``."""
    distinct = np.diff(table.indptr)
    rows = np.repeat(np.arange(table.vocab_size), distinct)
    row_total = np.bincount(rows, weights=table.counts, minlength=table.vocab_size)
    c = table.counts.astype(np.float64) - 1
    total = row_total[rows] - 1
    T = distinct[rows] - (c == 0)
    p = np.exp(log_p[table.indices])
    with np.errstate(divide="ignore", invalid="ignore"):
        if d is None:
            q = (c + T * p) / (total + T)
        else:
            q = np.maximum(c - d, 0) / total + d * T / total * p
    q = np.where(total > 0, q, p)
    return float(-(table.counts * np.log2(q)).sum() / table.counts.sum())


def screen(data_bin: str, kind: str) -> list:
    train_counts, train = count(data_bin, kind, "train")
    _, valid = count(data_bin, kind, "valid")
    log_p = unigram.unigram_log_probs(train_counts).double().numpy()
    rows = []
    for name, (d, residual) in residuals(train, log_p).items():
        in_sample = cross_entropy(train, residual, log_p, train)
        rows.append({"prior": name,
                     "valid": cross_entropy(train, residual, log_p, valid),
                     "train": in_sample,
                     "loo": in_sample if name == "unigram" else leave_one_out(train, log_p, d)})
    tokens = int(train.counts.sum())
    singletons = float((train.counts == 1).sum() / len(train.counts))
    return rows, {"tokens": tokens, "pairs": len(train.counts), "singletons": singletons}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpora", nargs="+", metavar="DATA_BIN:KIND",
                        help="KIND: SRC-TGT (translation, the target side) or lm")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args()
    lines = ["| corpus | training tokens / distinct pairs (seen once) | prior | "
             "held-out CE | in-sample CE | gap | leave-one-out CE |", "|---|---|---|---|---|---|---|"]
    for item in args.corpora:
        data_bin, _, kind = item.rpartition(":")
        if not data_bin or not kind:
            raise SystemExit(f"bigram_smoothing: {item!r}: give DATA_BIN:SRC-TGT or DATA_BIN:lm")
        rows, size = screen(data_bin, kind)
        name = f"{Path(data_bin).parent.name} ({kind})"
        described = (f"{size['tokens']:,} / {size['pairs']:,} "
                     f"({100 * size['singletons']:.0f}%)")
        for row in rows:
            lines.append(f"| {name} | {described} | {row['prior']} | {row['valid']:.3f} | "
                         f"{row['train']:.3f} | {row['valid'] - row['train']:.3f} | {row['loo']:.3f} |")
            name = described = ""
        print("\n".join(lines[-len(rows):]), flush=True)
    table = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(
            "# Bigram priors for `--natbias-order 2`: held-out and in-sample "
            "cross-entropy (bits per target token)\n\nCommand: `"
            + " ".join(["python", "benchmarks/bigram_smoothing.py", *sys.argv[1:]])
            + "`\n\n" + table + "\n", encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
