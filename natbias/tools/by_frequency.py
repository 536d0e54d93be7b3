"""Measures by training frequency, computed from numbers alone (numpy, no torch):
what natbias-loss-by-frequency and natbias-output-frequency report.

Bins are intervals of a token type's count in the training targets. ``edges``
are the bins' inclusive lower bounds, increasing: ``(1, 51, 101)`` is the bins
1-50, 51-100 and >= 101; a type counted below the first edge is in no bin.

* :func:`loss_difference_bins`: the per-token loss difference between two
  models, its median (Pappas et al., 2020, sec. 4.3 and Fig. 3, after Baevski
  and Auli, 2019: "the median instead of the average to reduce the effect of
  outliers") and mean per bin, with the token count. The difference is
  ``loss(model) - loss(baseline)`` in bits: negative where the model is better.
* :func:`output_frequency_bins`: per bin, the tokens a system produced over
  the tokens in the references (1: as often as the references; above 1:
  over-generated).
* :func:`kl_bits`: KL(p || q) in bits, for Kobayashi et al.'s (2023, sec.
  3.1, Table 1) divergence of a model's average prediction from the corpus
  unigram (the average itself is computed where the model runs).

Kept apart from the scoring (fairseq_natbias.scoring, natbias.hf.scoring) so
that the statistics are tested, and output-frequency runs, without torch.
"""

import csv
import math
import os
from collections.abc import Sequence

import numpy as np

from natbias.errors import NaturalBiasError
from natbias.tools import plots

# Pappas et al. (2020) name one bin in their text, "words occurring 1-50 times
# in the training dataset"; the other intervals of their Fig. 3 are not in the
# text. These continue it by factors of 2 to 10, and keep types unseen in
# training (count 0) in a bin of their own.
DEFAULT_EDGES = (0, 1, 51, 101, 501, 1001, 5001, 10001)
# Bins with fewer tokens than this are marked ("few") in the CSV and the plot.
DEFAULT_MIN_TOKENS = 30
LN2 = math.log(2.0)


def check_edges(edges: Sequence[int]) -> np.ndarray:
    """The bins' lower bounds as int64; none, or out of order, is refused."""
    if edges is None or len(edges) == 0:
        raise NaturalBiasError(
            "an empty bin set: give at least one bin edge (e.g. --edges 1 51 101)"
        )
    values = np.asarray(edges)
    if values.dtype.kind not in "iu" or (values < 0).any():
        raise NaturalBiasError(f"bin edges are training counts >= 0, got {list(edges)}")
    if (np.diff(values) <= 0).any():
        raise NaturalBiasError(
            f"bin edges out of order: {' '.join(map(str, edges))}; give strictly "
            "increasing lower bounds (e.g. 1 51 101)"
        )
    return values.astype(np.int64)


def bin_labels(edges: Sequence[int]) -> list[str]:
    """``1-50``, ``51-100``, ..., ``>=10001`` (a bin of one count: just the count)."""
    labels = []
    for low, high in zip(edges, list(edges[1:]) + [None]):
        if high is None:
            labels.append(f">={low}")
        elif high - 1 == low:
            labels.append(str(low))
        else:
            labels.append(f"{low}-{high - 1}")
    return labels


def bin_of(train_counts: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each count: ``k`` for ``edges[k] <= count < edges[k + 1]``, -1 below the first."""
    return np.searchsorted(edges, np.asarray(train_counts), side="right") - 1


def _rows_by_bin(train_counts, edges, row_of, what: str, key: str) -> list[dict]:
    """One row per bin: its label, its lower bound and ``row_of(members)`` (the
    bin's types or tokens, a boolean mask); refused when every ``key`` is 0."""
    edges = check_edges(edges)
    bins = bin_of(train_counts, edges)
    rows = [
        {"bin": label, "low": int(edges[k]), **row_of(bins == k)}
        for k, label in enumerate(bin_labels(edges))
    ]
    if not any(row[key] for row in rows):
        raise NaturalBiasError(
            f"no {what} falls in any bin (lower bounds {' '.join(map(str, edges))}): "
            "every bin is empty; lower the first edge"
        )
    return rows


def loss_difference_bins(
    token_ids: np.ndarray,
    loss_baseline: np.ndarray,
    loss_model: np.ndarray,
    train_counts: np.ndarray,
    edges: Sequence[int] = DEFAULT_EDGES,
    min_tokens: int = DEFAULT_MIN_TOKENS,
) -> list[dict]:
    """One row per bin: reference tokens, their types, the median and mean of
    ``loss_model - loss_baseline`` and each model's mean loss. ``token_ids`` and the
    losses (bits) have one entry per reference token; ``train_counts`` one per type."""
    token_ids = np.asarray(token_ids, dtype=np.int64)
    baseline, model = np.asarray(loss_baseline, np.float64), np.asarray(loss_model, np.float64)
    difference = model - baseline

    def row_of(members):
        n = int(members.sum())
        row = {"tokens": n, "types": len(np.unique(token_ids[members])), "few": n < min_tokens}
        if n:
            row["median_difference_bits"] = float(np.median(difference[members]))
            row["mean_difference_bits"] = float(difference[members].mean())
            row["mean_loss_baseline_bits"] = float(np.mean(baseline[members]))
            row["mean_loss_model_bits"] = float(np.mean(model[members]))
        return row

    counts = np.asarray(train_counts)[token_ids]
    return _rows_by_bin(counts, edges, row_of, "reference token", "tokens")


def output_frequency_bins(
    produced: np.ndarray,
    reference: np.ndarray,
    train_counts: np.ndarray,
    edges: Sequence[int] = DEFAULT_EDGES,
    min_tokens: int = DEFAULT_MIN_TOKENS,
) -> list[dict]:
    """One row per bin: the tokens produced (hypotheses) and in the references
    whose type falls in it, and produced / reference. Each argument holds one
    count per token type."""

    def row_of(members):
        n_produced, n_reference = int(produced[members].sum()), int(reference[members].sum())
        return {
            "produced": n_produced,
            "reference": n_reference,
            "ratio": n_produced / n_reference if n_reference else math.nan,
            "few": n_reference < min_tokens,
        }

    return _rows_by_bin(train_counts, edges, row_of, "token", "reference")


def kl_bits(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) in bits of two distributions over one vocabulary (q > 0 where p > 0)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    p, q = p / p.sum(), q / q.sum()
    kept = p > 0
    kl = float(np.sum(p[kept] * (np.log(p[kept]) - np.log(q[kept]))) / LN2)
    return max(0.0, kl)  # KL >= 0: no "-0.0000" from rounding


def smoothed_unigram(train_counts: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """The add-alpha unigram of the counts (the package's prior, natbias.prior)."""
    counts = np.asarray(train_counts, np.float64) + alpha
    return counts / counts.sum()


def write_rows(rows: list[dict], path: str) -> str:
    """``rows`` as CSV (the union of their keys, in first-seen order; blanks where absent)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_bins(rows: list[dict], out_dir: str, name: str, key: str, ylabel: str, line: float):
    """``name``.csv (every column) and ``name``.png (``row[key]`` per bin, a
    horizontal line at ``line``) in ``out_dir``; their paths."""
    csv_path = write_rows(rows, os.path.join(out_dir, f"{name}.csv"))
    return [csv_path, bin_plot(rows, key, ylabel, os.path.join(out_dir, f"{name}.png"), line)]


def bin_plot(rows: list[dict], key: str, ylabel: str, path: str, reference_line: float) -> str:
    """A bar per bin of ``row[key]``, bins with few tokens hatched and named so."""
    fig, axes = plots.grid([rows], path)
    ax = axes[0][0]
    shown = [r for r in rows if key in r and math.isfinite(r[key])]
    for i, row in enumerate(shown):
        ax.bar(i, row[key], color=plots.color_of(0), hatch="//" if row["few"] else None, alpha=0.8)
    ax.axhline(reference_line, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shown)), [r["bin"] + (" (few)" if r["few"] else "") for r in shown])
    ax.tick_params(axis="x", labelrotation=45, labelsize="small")
    ax.set_xlabel("training count of the token")
    ax.set_ylabel(ylabel)
    return plots.save(fig, path)


def markdown_table(rows: list[dict], columns: Sequence[str]) -> str:
    """A Markdown table of ``columns`` (floats with 4 decimals)."""

    def cell(value):
        if isinstance(value, float):
            return f"{value:.4f}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
