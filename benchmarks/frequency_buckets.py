"""Are rare target tokens helped or hurt? The frequency-bucket view of a
study's best checkpoints (issue 36), from ``natbias-frequency``'s
``frequency_tokens.csv`` (one per pair and seed, every arm a model in it).

The test set's reference tokens are sorted by their type's training
log-unigram and cut into three buckets holding a third of the tokens each
(a type is never split: it goes to the bucket its first occurrence falls in):
``rare``, ``middle``, ``frequent``. Per bucket and model: the mean
log-probability the model gives the reference token (teacher-forced, full
model), in bits per token, weighted by occurrences. Printed as a Markdown
table, mean ± standard error over the CSVs (seeds) of each pair, with each
arm's difference to ``stock`` paired by seed.

    natbias-frequency DATA --model stock=RUN/stock/seed1/checkpoint_best.pt \\
        --model default=... --model capped=... --out-dir freq/de-en_seed1
    .venv/bin/python benchmarks/frequency_buckets.py de-en=freq/de-en_seed1/frequency_tokens.csv \\
        de-en=freq/de-en_seed2/frequency_tokens.csv --out benchmarks/results/x.md
"""

import argparse
import csv
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairseq_natbias.analysis.stats import mean_stderr  # noqa: E402

BUCKETS = ("rare", "middle", "frequent")
REFERENCE = "stock"
LN2 = math.log(2.0)


def read_tokens(path):
    """``{model: [(log_unigram, occurrences, avg_logprob_full), ...]}``."""
    rows = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(row["model"], []).append(
                (float(row["log_unigram"]), int(row["occurrences"]),
                 float(row["avg_logprob_full"])))
    return rows


def bucket_of_types(types):
    """Bucket index (0 rare .. 2 frequent) of each (log_unigram, occurrences)
    type, in the order given: types sorted by log-unigram (ties by position),
    a type's bucket the third its first token falls in."""
    order = sorted(range(len(types)), key=lambda i: (types[i][0], i))
    total = sum(occurrences for _, occurrences in types)
    buckets, seen = [0] * len(types), 0
    for index in order:
        buckets[index] = min(len(BUCKETS) - 1, 3 * seen // total)
        seen += types[index][1]
    return buckets


def bucket_logprobs(rows):
    """Occurrence-weighted mean log-probability (bits) per bucket."""
    buckets = bucket_of_types([(log_unigram, count) for log_unigram, count, _ in rows])
    sums, counts = [0.0] * len(BUCKETS), [0] * len(BUCKETS)
    for (_, count, logprob), bucket in zip(rows, buckets):
        sums[bucket] += count * logprob / LN2
        counts[bucket] += count
    return [s / c if c else float("nan") for s, c in zip(sums, counts)]


def summarise(sources):
    """``{pair: {model: {seed: [bits per bucket]}}}`` from (pair, path) pairs;
    a seed is the index of its CSV among the pair's, so an arm scored on
    fewer seeds than stock is paired with stock on the seeds both have."""
    found, seen = {}, {}
    for pair, path in sources:
        seed = seen[pair] = seen.get(pair, -1) + 1
        for model, rows in read_tokens(path).items():
            found.setdefault(pair, {}).setdefault(model, {})[seed] = bucket_logprobs(rows)
    return found


def markdown(found):
    out = ["| pair | arm | n | " + " | ".join(f"{b} third (bits/token)" for b in BUCKETS)
           + " | " + " | ".join(f"{b}: − stock, paired" for b in BUCKETS) + " |",
           "|---" * (3 + 2 * len(BUCKETS)) + "|"]
    for pair, models in found.items():
        reference = models.get(REFERENCE)
        for model, seeds in models.items():
            cells = [mean_stderr([s[b] for s in seeds.values()]).format(3, count=False)
                     for b in range(len(BUCKETS))]
            # Paired with stock on the seeds (CSVs) that scored both.
            shared = (sorted(set(seeds) & set(reference))
                      if reference is not None and model != REFERENCE else [])
            if shared:
                cells += [mean_stderr([seeds[s][b] - reference[s][b] for s in shared]).signed(3)
                          for b in range(len(BUCKETS))]
            else:
                cells += [""] * len(BUCKETS)
            out.append(f"| {pair} | {model} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokens", nargs="+", metavar="PAIR=CSV",
                        help="natbias-frequency's frequency_tokens.csv, labelled by pair")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    sources = []
    for item in args.tokens:
        pair, _, path = item.rpartition("=")
        if not pair or not Path(path).is_file():
            raise SystemExit(f"frequency_buckets: give PAIR=CSV with an existing file, not {item!r}")
        sources.append((pair, path))
    text = markdown(summarise(sources))
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
