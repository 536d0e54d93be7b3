"""The report of the transformers examples' runs: a Markdown table and a plot
of validation NLL over updates, each arm against transformers' stock training.

    python examples/huggingface/report.py WORK [WORK ...] [--out report.md]

Reads WORK/runs/<arm>/seed<k>/record.json (translate.py, language_model.py).
Per arm, over seeds (mean ± standard error): validation NLL at update 0 (and
the prior's cross-entropy, what a model predicting the unigram scores), at
the last update, the best and where; the updates each run needs to reach
stock's mean best NLL, as a fraction of the updates stock took to its best
(interpolated between validations); the test scores (BLEU and chrF with
sacreBLEU's signature, or NLL and perplexity). Then each arm paired by seed
with stock and with stock + unigram label smoothing: the differences of best
NLL and of test BLEU.
"""

import argparse
import json
import math
from pathlib import Path

import numpy as np

from natbias.tools.stats import mean_stderr

STOCK = "stock"
# Each arm is paired, seed by seed, with these (the end targets).
REFERENCES = (STOCK, "stock+unigram-ls")


def load_runs(work):
    """``{arm: {seed: record}}`` of the runs that are done."""
    runs = {}
    for path in sorted(Path(work).glob("runs/*/seed*/record.json")):
        if (path.parent / "done").exists():
            seed = int(path.parent.name[len("seed") :])
            runs.setdefault(path.parent.parent.name, {})[seed] = json.loads(path.read_text())
    return runs


def reach(record, target):
    """The first update at which the validation NLL is at or below
    ``target``, interpolated linearly between validations; inf if never."""
    updates, nll = record["updates"], record["nll"]
    for i, value in enumerate(nll):
        if value <= target:
            if i == 0:
                return 0.0
            u0, u1, v0, v1 = updates[i - 1], updates[i], nll[i - 1], value
            return u0 + (u1 - u0) * (v0 - target) / (v0 - v1)
    return math.inf


def summary(runs):
    """The report's rows, one per arm, stock first."""
    stock = runs.get(STOCK, {})
    # Stock's best, not its last: a run stopped past its best ends above it.
    target = float(np.mean([r["best_nll"] for r in stock.values()])) if stock else None
    updates = float(np.mean([r["best_update"] for r in stock.values()])) if stock else None
    rows = []
    for arm in sorted(runs, key=lambda a: (a != STOCK, a)):
        records = runs[arm]
        row = {
            "arm": arm,
            "seeds": sorted(records),
            "unigram": mean_stderr([r["unigram_nll"] for r in records.values()]),
            "step0": mean_stderr([r["nll"][0] for r in records.values()]),
            "last": mean_stderr([r["nll"][-1] for r in records.values()]),
            "best": mean_stderr([r["best_nll"] for r in records.values()]),
            "best_update": mean_stderr([r["best_update"] for r in records.values()]),
        }
        if target is not None:
            ratios = [reach(r, target) / updates for r in records.values()]
            row["reach"] = mean_stderr(ratios) if all(map(math.isfinite, ratios)) else None
        row["scores"] = {}
        for test_set in sorted({t for r in records.values() for t in r.get("scores", {})}):
            for key, value in next(iter(records.values()))["scores"][test_set].items():
                if isinstance(value, str):
                    row["scores"][f"{test_set} {key}"] = value
                else:
                    row["scores"][f"{test_set} {key}"] = mean_stderr(
                        [r["scores"][test_set][key] for r in records.values()]
                    )
        rows.append(row)
    return rows, target


def paired_differences(runs):
    """Per arm and reference arm (``REFERENCES``), over the seeds both ran:
    the difference of best validation NLL and of each test BLEU, mean ±
    standard error of the per-seed differences."""
    rows = []
    for i, reference in enumerate(REFERENCES):
        for arm in sorted(runs):
            seeds = sorted(set(runs[arm]) & set(runs.get(reference, {})))
            if arm in REFERENCES[: i + 1] or not seeds:  # each pair of references once
                continue
            pairs = [(runs[arm][s], runs[reference][s]) for s in seeds]
            row = {"arm": arm, "reference": reference, "seeds": seeds}
            row["best"] = mean_stderr([a["best_nll"] - b["best_nll"] for a, b in pairs])
            for test_set in sorted(pairs[0][0].get("scores", {})):
                if "BLEU" in pairs[0][0]["scores"][test_set]:
                    row[f"{test_set} BLEU"] = mean_stderr(
                        [
                            a["scores"][test_set]["BLEU"] - b["scores"][test_set]["BLEU"]
                            for a, b in pairs
                        ]
                    )
            rows.append(row)
    return rows


def differences_markdown(rows):
    if not rows:
        return ""
    keys = [k for k in rows[0] if k.endswith("BLEU")]
    head = ["arm", "against", "seeds", "best NLL"] + keys
    lines = ["", "Paired by seed (mean ± standard error of the differences):", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["arm"], row["reference"], ",".join(map(str, row["seeds"]))]
        cells += [row["best"].signed(3)] + [row[k].signed(2) if k in row else "" for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reach_cell(row):
    if row["arm"] == STOCK:
        return ""
    return "never" if row.get("reach") is None else f"{row['reach'].format(2, False)}×"


def markdown(rows, target, title):
    numbers = [k for k in rows[0]["scores"] if not k.endswith("signature")] if rows else []
    head = [
        "arm",
        "seeds",
        "prior's NLL",
        "NLL at 0",
        "NLL at the end",
        "best NLL (update)",
        "reach of stock's best",
    ] + numbers
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [
            row["arm"],
            ",".join(map(str, row["seeds"])),
            row["unigram"].format(3, False),
            row["step0"].format(3, False),
            row["last"].format(3, False),
            f"{row['best'].format(3, False)} ({row['best_update'].mean:.0f})",
            reach_cell(row),
        ]
        cells += [row["scores"][key].format(2, False) for key in numbers]
        lines.append("| " + " | ".join(cells) + " |")
    signatures = sorted(
        {v for row in rows for k, v in row["scores"].items() if k.endswith("signature")}
    )
    lines += [
        "",
        "NLL in bits per target token (validation); mean ± standard error over "
        f"seeds; reach: updates to stock's mean best NLL ({target:.3f}), as a fraction of "
        "the updates stock took to its best."
        if target
        else "",
    ]
    lines += [f"sacreBLEU: {s}" for s in signatures]
    return "\n".join(lines) + "\n"


def plot(runs, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arm in sorted(runs, key=lambda a: (a != STOCK, a)):
        curves = [np.array([r["updates"], r["nll"]]) for r in runs[arm].values()]
        length = min(c.shape[1] for c in curves)
        updates = curves[0][0, :length]
        values = np.stack([c[1, :length] for c in curves])
        line = ax.plot(updates[1:], values.mean(0)[1:], label=f"{arm} ({len(curves)})")[0]
        if len(curves) > 1:
            spread = values.std(0, ddof=1)[1:] / math.sqrt(len(curves))
            ax.fill_between(
                updates[1:],
                values.mean(0)[1:] - spread,
                values.mean(0)[1:] + spread,
                color=line.get_color(),
                alpha=0.25,
            )
    ax.set_xscale("log")
    ax.set_xlabel("training updates")
    ax.set_ylabel("validation NLL (bits per token)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("works", nargs="+", metavar="WORK")
    parser.add_argument(
        "--out",
        help="write the tables here too, and a plot beside each WORK's "
        "name (OUT without .md, _WORKNAME_valid_nll.png)",
    )
    args = parser.parse_args(argv)
    tables = []
    for work in args.works:
        runs = load_runs(work)
        if not runs:
            raise SystemExit(f"report.py: error: no finished runs in {work}/runs")
        rows, target = summary(runs)
        tables.append(markdown(rows, target, Path(work).name))
        tables[-1] += differences_markdown(paired_differences(runs))
        if args.out:
            image = Path(args.out).with_suffix("").as_posix() + f"_{Path(work).name}_valid_nll.png"
            plot(runs, image, Path(work).name)
            tables[-1] += f"\n![validation NLL]({Path(image).name})\n"
    text = "\n".join(tables)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
