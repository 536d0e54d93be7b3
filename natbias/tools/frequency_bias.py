"""A language model's BLiMP frequency bias ("Rare Word Representation Learning by
Smoothing Over Word Classes", an anonymous ACL submission: sec. 4.1 and App. E),
from token ids, training counts and sentence scores (numpy, no torch): what
natbias-frequency-bias reports.

For each minimal pair (``sentence_good``, ``sentence_bad``) in the model's tokens:

1. The differing tokens are the multiset differences of the two token
   sequences: the good sentence's tokens not matched in the bad one, and the
   bad sentence's not matched in the good one (each occurrence matched once).
   The paper does not say how subword tokens are matched; this matches the
   tokens the model reads, so a replaced word split into pieces contributes
   the pieces that differ, and a piece both words share is no difference.
2. App. E's filter keeps replacements only: pairs where both sides have
   differing tokens. Pairs with none (the same tokens in another order) and
   pairs where one side has none (tokens only added) are counted and skipped.
3. Each side's frequency is the mean training count of its differing tokens
   (with multiplicity); the pair's relative difference is
   ``(f_good - f_bad) / (f_good + f_bad)`` (0 when both are 0): positive where
   the good sentence's tokens are more frequent. Any relative difference that
   grows with f_good / f_bad ranks the pairs alike.
4. The pairs are ranked by it (ties in file order); the lower and the upper
   third (``n // 3`` pairs each; the middle takes the rest) are scored as BLiMP
   is: a pair is right when the model gives the good sentence the higher
   log-probability (strictly). The bias is upper third's score minus lower's.

The pairs of all the files given are ranked together (the paper ranks BLiMP's
pairs as one set). Per phenomenon (one file each, as BLiMP is distributed)
``phenomenon_rows`` gives BLiMP's own score over all its pairs, skipped ones
included, beside how many of its pairs fall in each third and their score.
"""

import json
import math
import os
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from natbias.errors import NaturalBiasError
from natbias.tools.generate_output import read_text_lines

REPLACEMENT, REORDERED, ADDED = "replacement", "reordered", "added"
THIRDS = ("lower", "middle", "upper")
BLIMP_FILE = re.compile(r"\.jsonl(\.gz)?$")


@dataclass
class Pair:
    line: int  # 1-based line of the JSON lines file
    good: str
    bad: str
    phenomenon: str = ""  # the file's name less .jsonl(.gz): BLiMP's UID


def pair_files(paths: Sequence[str]) -> list[str]:
    """BLiMP as distributed: its ``.jsonl`` files, plain or gzipped, or a folder
    holding them (sorted); one file a phenomenon, each given once."""
    files, seen = [], {}
    for path in paths:
        inside = sorted(os.listdir(path)) if os.path.isdir(path) else None
        found = [os.path.join(path, n) for n in inside if BLIMP_FILE.search(n)] if inside else []
        if inside is not None and not found:
            raise NaturalBiasError(f"{path}: no .jsonl(.gz) files; give BLiMP's data folder")
        files += found if inside is not None else [path]
    for path in files:
        name = BLIMP_FILE.sub("", os.path.basename(path))
        if seen.setdefault(name, path) != path:
            raise NaturalBiasError(f"{seen[name]} and {path}: phenomenon {name} given twice")
    return files


def read_pairs(path: str) -> list[Pair]:
    """BLiMP's JSON lines: one object a line with ``sentence_good`` and ``sentence_bad``."""
    pairs, phenomenon = [], BLIMP_FILE.sub("", os.path.basename(path))
    for number, line in enumerate(read_text_lines(path, "BLiMP's JSON lines"), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            pairs.append(Pair(number, item["sentence_good"], item["sentence_bad"], phenomenon))
        except (ValueError, KeyError, TypeError):
            raise NaturalBiasError(
                f"{path}:{number}: expected a JSON object with sentence_good and "
                "sentence_bad (BLiMP's format)"
            ) from None
    if not pairs:
        raise NaturalBiasError(f"{path} holds no minimal pairs")
    return pairs


def differing_tokens(good: Sequence[int], bad: Sequence[int]) -> tuple[list[int], list[int], str]:
    """Each side's tokens not matched in the other (sorted), and the pair's kind."""
    good_only = sorted((Counter(good) - Counter(bad)).elements())
    bad_only = sorted((Counter(bad) - Counter(good)).elements())
    if good_only and bad_only:
        kind = REPLACEMENT
    elif not good_only and not bad_only:
        kind = REORDERED
    else:
        kind = ADDED
    return good_only, bad_only, kind


def relative_difference(f_good: float, f_bad: float) -> float:
    total = f_good + f_bad
    return (f_good - f_bad) / total if total else 0.0


@dataclass
class FrequencyBias:
    rows: list[dict]  # one per kept pair, in rank order (lowest relative difference first)
    skipped: dict  # kind -> number of pairs skipped
    lower_score: float
    middle_score: float
    upper_score: float
    third: int  # pairs in the lower (and the upper) third

    @property
    def bias(self) -> float:
        return self.upper_score - self.lower_score

    @property
    def score(self) -> float:
        """The BLiMP score of all kept pairs."""
        return float(np.mean([row["correct"] for row in self.rows]))


def frequency_bias(
    pairs: Sequence[Pair],
    tokens: Sequence[tuple[Sequence[int], Sequence[int]]],
    train_counts: np.ndarray,
    scores: Sequence[tuple[float, float]],
) -> FrequencyBias:
    """``tokens[i]``: pair i's (good, bad) token ids; ``scores[i]``: their log-probabilities."""
    rows, skipped = [], Counter()
    train_counts = np.asarray(train_counts)
    for pair, (good, bad), (score_good, score_bad) in zip(pairs, tokens, scores):
        good_only, bad_only, kind = differing_tokens(good, bad)
        if kind != REPLACEMENT:
            skipped[kind] += 1
            continue
        f_good = float(np.mean(train_counts[good_only]))
        f_bad = float(np.mean(train_counts[bad_only]))
        rows.append(
            {
                "phenomenon": pair.phenomenon,
                "line": pair.line,
                "good_tokens": len(good_only),
                "bad_tokens": len(bad_only),
                "good_mean_count": f_good,
                "bad_mean_count": f_bad,
                "relative_difference": relative_difference(f_good, f_bad),
                "logprob_good": float(score_good),
                "logprob_bad": float(score_bad),
                "correct": bool(score_good > score_bad),
            }
        )
    third = len(rows) // 3
    require_thirds(len(rows), len(pairs), skipped)
    rows.sort(key=lambda row: row["relative_difference"])  # stable: ties in file order
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
        row["third"] = (
            "lower" if rank <= third else "upper" if rank > len(rows) - third else "middle"
        )

    third_scores = [mean_or_nan([r["correct"] for r in rows if r["third"] == t]) for t in THIRDS]
    return FrequencyBias(rows, dict(skipped), *third_scores, third)


def require_thirds(kept: int, pairs: int, skipped: dict) -> None:
    if kept // 3 == 0:
        raise NaturalBiasError(
            f"{kept} replacement pairs left of {pairs} ({skipped_text(skipped)}): "
            "ranking into thirds needs at least 3"
        )


def check_pairs(tokens: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
    """Refuse, before any is scored, pairs of which too few replace tokens to rank."""
    kinds = Counter(differing_tokens(good, bad)[2] for good, bad in tokens)
    kept = kinds.pop(REPLACEMENT, 0)
    require_thirds(kept, len(tokens), dict(kinds))


def skipped_text(skipped: dict) -> str:
    """``3 pairs skipped as no replacement (2 reordered, 1 added)`` or ``none skipped``."""
    total = sum(skipped.values())
    if not total:
        return "no pair skipped"
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items()))
    return f"{total} pairs skipped as no replacement ({parts})"


def mean_or_nan(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def phenomenon_rows(
    pairs: Sequence[Pair], scores: Sequence[tuple[float, float]], result: FrequencyBias
) -> list[dict]:
    """One row a phenomenon (in the order given), then ``all``: BLiMP's score over
    all its pairs (right: the good sentence strictly more probable), skipped ones
    included, as BLiMP reports it (``all``: the mean of the phenomena's, BLiMP's
    overall score); the pairs kept; how many fall in the lower and the upper third
    of the ranking of all pairs given, their score there, upper minus lower."""
    right, thirds = defaultdict(list), defaultdict(lambda: defaultdict(list))
    for pair, (score_good, score_bad) in zip(pairs, scores):
        right[pair.phenomenon].append(bool(score_good > score_bad))
    for row in result.rows:  # None: all pairs
        for name in (row["phenomenon"], None):
            thirds[name][row["third"]].append(row["correct"])
    names = list(dict.fromkeys(pair.phenomenon for pair in pairs))
    rows = [(n, len(right[n]), mean_or_nan(right[n]), thirds[n]) for n in names]
    rows.append(("all", len(pairs), mean_or_nan([r[2] for r in rows]), thirds[None]))
    return [
        {"phenomenon": name, "pairs": n, "blimp_score": score, "kept": sum(map(len, t.values())),
         "lower_pairs": len(t["lower"]), "lower_score": mean_or_nan(t["lower"]),
         "upper_pairs": len(t["upper"]), "upper_score": mean_or_nan(t["upper"]),
         "frequency_bias": mean_or_nan(t["upper"]) - mean_or_nan(t["lower"])}
        for name, n, score, t in rows
    ]  # fmt: skip
