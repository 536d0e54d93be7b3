"""Means over seeds of the 20,000-update --converge runs (issue 19, item 1),
from every source that kept a seed's figures: the run records the study writes
(results/runs/<pair>_short-converge/<arm>/seed<k>.json) and, for seeds whose run
folders were lost before records were kept, the per-seed figures committed in
0.3.4 (results/seeds/short-converge_before_records.csv, with chrF from
results/seeds/short-converge_two_seed_chrf.csv).

For each pair and arm it prints best validation NLL, test BLEU and chrF
(test_2016_flickr, test_2017_flickr) as mean ± standard error over seeds, the
NLL and BLEU of each seed side by side for the arms, and
differences between arms (--compare; by default each arm minus stock, and
zero minus the default): NLL and BLEU paired by seed (the seeds both have),
chrF as a difference of means (seeds 1-2's chrF is known only as a pair of
values, not by seed).

Run with the default selection (every pair, arm and comparison, the committed
results folder), it also writes what it prints to
results/converge_3seeds.md (``wrote PATH`` on stderr), under a header that
names the command and the sources; --out writes elsewhere (any selection).

    .venv/bin/python research/combine_seeds.py
    .venv/bin/python research/combine_seeds.py --pairs de-en --compare gain/zero:stock
"""

import argparse
import csv
import itertools
import json
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "research"))

# The study that wrote the records: its arm folders and test-set names.
from study.arms import CONVERGE_TEST_SETS, Arm  # noqa: E402

from natbias.tools.stats import mean_stderr  # noqa: E402

RESULTS = REPO / "research" / "results"
SETTING = "short-converge"
METRICS = ("best_valid_nll", "bleu_test_2016", "chrf_test_2016", "bleu_test_2017", "chrf_test_2017")
PAIRED = ("best_valid_nll", "bleu_test_2016", "bleu_test_2017")
DEFAULT_PAIRS = ["de-en", "fr-en"]
DEFAULT_ARMS = ["stock", "gain/unigram", "gain/zero"]
DEFAULT_COMPARE = ["gain/unigram:stock", "gain/zero:stock", "gain/zero:gain/unigram"]
DEFAULT_BUDGET = "20,000 updates"
# What the default selection writes into the results folder.
TABLE_NAME = "converge_3seeds.md"


def read_csv(path):
    """Rows of a CSV whose leading ``#`` lines are comments; none when the
    file is absent (only the short-converge study has seeds from before
    the records)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def seed_from_record(record):
    """One seed's figures from the study's run record: the lowest validation
    NLL and the best checkpoint's test scores (the first test set is the
    data-bin's own test split, stored without a suffix). A test set the run
    was not scored on (a GPU study cut off while decoding) is left out: its
    cells in the tables show a dash."""
    scores = record["scores"]
    second = CONVERGE_TEST_SETS[1]
    figures = {
        "best_valid_nll": min(record["nll"]),
        "bleu_test_2016": scores["bleu"],
        "chrf_test_2016": scores["chrf"],
    }
    if f"bleu_{second}" in scores:
        figures.update(
            {"bleu_test_2017": scores[f"bleu_{second}"], "chrf_test_2017": scores[f"chrf_{second}"]}
        )
    return figures


def seed_from_row(row):
    return {metric: float(row[metric]) for metric in METRICS if row[metric].strip()}


def collect_seeds(pairs, arms, results=RESULTS, setting=SETTING):
    """``{(pair, arm): {seed: {metric: value}}}`` for the given pairs and
    arms that have a seed. A run record (where the study keeps it:
    runs/<pair>_<setting>/<arm's folder>/seed<k>.json) wins over a typed-in
    row for the same seed (it is the run's own output)."""
    seeds = {}
    for row in read_csv(results / "seeds" / f"{setting}_before_records.csv"):
        if row["pair"] in pairs and row["arm"] in arms:
            seeds.setdefault((row["pair"], row["arm"]), {})[int(row["seed"])] = seed_from_row(row)
    for pair in pairs:
        for arm in arms:
            archive = results / "runs" / f"{pair}_{setting}" / Arm.parse(arm).folder
            for path in sorted(archive.glob("seed*.json")):
                seed = int(path.stem[len("seed") :])
                record = json.loads(path.read_text())
                if "bleu" not in record["scores"]:
                    raise SystemExit(
                        f"combine_seeds: {path} holds no BLEU (a language model's record?): "
                        "this script combines translation runs; for language models the "
                        "study's own table combines the seeds (study_learning_efficiency.py "
                        "--task lm ... --summarise-only)"
                    )
                seeds.setdefault((pair, arm), {})[seed] = seed_from_record(record)
    return seeds


def two_seed_values(results=RESULTS, setting=SETTING):
    """``{(pair, arm, metric): [a, b]}`` from two-seed mean ± s.e.: for two
    values, mean ± s.e. = (a + b)/2 ± |a - b|/2 (s.e. = s/sqrt(2), s =
    |a - b|/sqrt(2)), so the values are mean - s.e. and mean + s.e."""
    pairs = {}
    for row in read_csv(results / "seeds" / f"{setting}_two_seed_chrf.csv"):
        mean, stderr = float(row["mean"]), float(row["stderr"])
        pairs[(row["pair"], row["arm"], f"chrf_{row['test_set']}")] = [mean - stderr, mean + stderr]
    return pairs


def values_over_seeds(seeds, two_seed, pair, arm, metric):
    """Every seed's value of ``metric``; a two-seed pair fills the seeds
    that lack it, when exactly two do."""
    per_seed = seeds.get((pair, arm), {})
    known = [figures[metric] for figures in per_seed.values() if metric in figures]
    missing = len(per_seed) - len(known)
    recovered = two_seed.get((pair, arm, metric))
    if missing and recovered and missing == len(recovered):
        known += recovered
    return known if len(known) == len(per_seed) else []


def paired_difference(seeds, pair, arm, reference_arm, metric):
    """``arm - reference_arm`` seed by seed, over the seeds both have."""
    mine, reference = seeds.get((pair, arm), {}), seeds.get((pair, reference_arm), {})
    common = sorted(
        seed
        for seed in mine
        if seed in reference and metric in mine[seed] and metric in reference[seed]
    )
    return common, [mine[seed][metric] - reference[seed][metric] for seed in common]


def seed_list(seeds, pair, arm):
    return ", ".join(str(seed) for seed in sorted(seeds[(pair, arm)]))


def digits_of(metric):
    """Bits to 3 decimals, BLEU and chrF to 2, as in the study's tables."""
    return 3 if metric == "best_valid_nll" else 2


def cell(values, metric):
    """Mean ± standard error over seeds, to the metric's digits."""
    return mean_stderr(values).format(digits_of(metric), count=False)


def table(seeds, two_seed, pairs, arms):
    lines = [
        "| pair, arm | seeds | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for pair, arm in itertools.product(pairs, arms):
        if (pair, arm) in seeds:
            cells = [cell(values_over_seeds(seeds, two_seed, pair, arm, m), m) for m in METRICS]
            lines.append(f"| {pair} {arm} | {seed_list(seeds, pair, arm)} | {' | '.join(cells)} |")
    return "\n".join(lines)


def per_seed_table(seeds, pairs, arms):
    """One row per pair and seed: each paired metric as the arms' values in
    ``arms`` order ("–" where an arm lacks that seed or figure)."""
    lines = ["| pair, seed | " + " | ".join(f"{m}: {' / '.join(arms)}" for m in PAIRED) + " |"]
    lines.append("|---|" + "---|" * len(PAIRED))
    for pair in pairs:
        for seed in sorted({seed for arm in arms for seed in seeds.get((pair, arm), {})}):
            figures = [seeds.get((pair, arm), {}).get(seed, {}) for arm in arms]
            cells = [
                " / ".join("–" if f.get(m) is None else f"{f[m]:.{digits_of(m)}f}" for f in figures)
                for m in PAIRED
            ]
            lines.append(f"| {pair} {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def differences(seeds, two_seed, pairs, comparisons):
    """One line per pair and ``(arm, reference_arm)`` that both have seeds."""
    lines = []
    for pair in pairs:
        for arm, reference_arm in comparisons:
            if (pair, arm) not in seeds or (pair, reference_arm) not in seeds:
                continue
            parts = []
            for metric in PAIRED:
                common, diffs = paired_difference(seeds, pair, arm, reference_arm, metric)
                if diffs:
                    parts.append(
                        f"{metric} {mean_stderr(diffs).signed(digits_of(metric))}"
                        f" (seeds {', '.join(map(str, common))})"
                    )
            for metric in ("chrf_test_2016", "chrf_test_2017"):
                mine = values_over_seeds(seeds, two_seed, pair, arm, metric)
                reference = values_over_seeds(seeds, two_seed, pair, reference_arm, metric)
                if mine and reference:
                    gap = mean_stderr(mine).mean - mean_stderr(reference).mean
                    parts.append(
                        f"{metric} {gap:+.2f} (difference of means, seeds "
                        f"{seed_list(seeds, pair, arm)} against {seed_list(seeds, pair, reference_arm)})"
                    )
            lines.append(f"- {pair} {arm} − {reference_arm}: " + "; ".join(parts))
    return "\n".join(lines)


def report(seeds, two_seed, pairs, arms, comparisons, budget=DEFAULT_BUDGET, setting=SETTING):
    """The text the script prints: the means, the per-seed table, the differences."""
    return (
        f"Multi30k, {setting}, {budget}: mean ± standard error over seeds\n\n"
        f"{table(seeds, two_seed, pairs, arms)}\n\nPer seed:\n\n"
        f"{per_seed_table(seeds, pairs, arms)}\n\nDifferences (NLL in bits, BLEU, chrF):\n\n"
        f"{differences(seeds, two_seed, pairs, comparisons)}\n"
    )


def results_file(text, pairs, argv=(), setting=SETTING, results=RESULTS):
    """``text`` (what :func:`report` returns) as the committed results file:
    a header naming the script, the command (its arguments ``argv``) and the
    sources, then the text."""
    runs = ", ".join(f"`runs/{pair}_{setting}/*/seed*.json`" for pair in pairs)
    command = " ".join([".venv/bin/python research/combine_seeds.py", *map(shlex.quote, argv)])
    typed_in = [
        f"`seeds/{setting}_{name}.csv`"
        for name in ("before_records", "two_seed_chrf")
        if (results / "seeds" / f"{setting}_{name}.csv").exists()
    ]
    return (
        f"# Multi30k {setting}: every seed combined\n\n"
        "Written by `research/combine_seeds.py` (do not edit by hand); regenerate with "
        f"`{command}`.\n"
        f"Sources (under research/results/): the study's run records {runs}"
        + (
            f"; for the seeds run before records were kept, {' and '.join(typed_in)}"
            if typed_in
            else ""
        )
        + ".\n\n"
        + text
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS)
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS)
    parser.add_argument(
        "--compare",
        nargs="+",
        default=DEFAULT_COMPARE,
        help="differences to print, as ARM:REFERENCE",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="folder holding runs/ and seeds/ (default: research/results)",
    )
    parser.add_argument(
        "--setting",
        default=SETTING,
        help="the study setting whose records to combine: runs/<pair>_<setting>/ "
        f"(default: {SETTING}; e.g. paper-converge-cuda)",
    )
    parser.add_argument(
        "--budget",
        default=DEFAULT_BUDGET,
        help=f"the runs' budget, for the title (default: {DEFAULT_BUDGET})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"also write the tables to this file (default: {TABLE_NAME} in "
        "--results when every pair, arm and comparison is the default)",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    comparisons = [tuple(text.split(":", 1)) for text in args.compare]
    arms = list(dict.fromkeys(args.arms + [arm for pair in comparisons for arm in pair]))
    seeds = collect_seeds(args.pairs, arms, args.results, args.setting)
    two_seed = two_seed_values(args.results, args.setting)
    text = report(seeds, two_seed, args.pairs, args.arms, comparisons, args.budget, args.setting)
    print(text, end="")
    out = args.out
    default_selection = (args.pairs, args.arms, args.compare, args.setting) == (
        DEFAULT_PAIRS,
        DEFAULT_ARMS,
        DEFAULT_COMPARE,
        SETTING,
    )
    if out is None and default_selection:
        out = args.results / TABLE_NAME
    if out is not None:
        out.write_text(results_file(text, args.pairs, argv, args.setting, args.results))
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
