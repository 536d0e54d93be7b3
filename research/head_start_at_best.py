"""Does the head start last to the best checkpoint? (issue 36)

The default starts at the unigram and leads stock fairseq early at every
corpus size, but ends clearly lower only on the smallest corpus. This reads
the learning-efficiency study's run records and measures, per corpus size
(a study setting), pair and seed, the default's lead over stock -- its
validation NLL minus stock's, interpolated onto stock's validation updates,
so negative is ahead -- at update 1,000 and at stock's best update, the
difference of the two bests, and the last validation at which the default is
ahead by at least --margin bits. Printed as a Markdown table (mean ± s.e.
over the seeds that have both arms); the plot draws the lead over updates
(mean ± s.e.), one panel per pair, one line per setting, stock's mean best
update marked on each line.

    .venv/bin/python research/head_start_at_best.py            # the committed selection
    .venv/bin/python research/head_start_at_best.py --pairs de-en \\
        --setting "3,000 short=n3000_short-converge:gain_0.05_20_capped-unigram" --out /tmp/x.md

A setting is ``LABEL=SETTING:ARM``: the records are
``RESULTS/runs/<pair>_<SETTING>/{stock,<ARM>}/seed<k>.json``.
"""

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "research"))

from study.runs import nll_curve  # noqa: E402
from study.summary import band  # noqa: E402

from natbias.tools import plots  # noqa: E402
from natbias.tools.stats import mean_stderr  # noqa: E402

RESULTS = REPO / "research" / "results"
REFERENCE = "stock"
DEFAULT_PAIRS = ["de-en", "fr-en"]
# Every size and schedule the study measured stock and the capped default at
# (the arm folder is the name the default had when the runs were made).
DEFAULT_SETTINGS = [
    "3,000 short=n3000_short-converge:gain_0.05_20_capped-unigram",
    "10,000 short=n10000_short-converge:gain_0.05_20_capped-unigram",
    "29,000 short=short-converge:gain_0.05_20_abs-capped-unigram",
    "3,000 paper=n3000_paper-converge-cuda:gain-unigram",
    "10,000 paper=n10000_paper-converge-cuda:gain-unigram",
    "29,000 paper, to 9,000=paper-converge-cuda:gain-unigram",
    "29,000 paper, CPU, to 16,000=paper-converge:gain-unigram",
]
DEFAULT_MARGIN = 0.03
EARLY = 1000
TABLE_NAME = "head_start_at_best.md"
HEADER = """# Does the head start last to the best checkpoint?

Written by `research/head_start_at_best.py` (do not edit by hand); regenerate with `{command}`.
Lead: the default's validation NLL minus stock's (bits; negative is ahead), the default's
curve interpolated onto stock's validations; mean ± s.e. over the seeds with both arms.
Schedules: short (lr 1e-3, 100 warm-up updates, CPU), paper (lr 5e-4 after 4,000 warm-up
updates, one NVIDIA H100; the row marked CPU on the CPU). Plot: [{png}]({png}).

"""


def parse_setting(text):
    """``LABEL=SETTING:ARM`` -> (label, setting, arm)."""
    match = re.fullmatch(r"([^=]+)=([^:]+):(.+)", text)
    if not match:
        raise SystemExit(
            f"head_start_at_best: --setting {text!r} is not LABEL=SETTING:ARM "
            "(e.g. '3,000 short=n3000_short-converge:gain-unigram')"
        )
    return match.groups()


def seed_pairs(results, pair, setting, arm):
    """``{seed: (stock record, arm record)}`` for the seeds that have both."""
    folder = results / "runs" / f"{pair}_{setting}"
    found = {}
    for stock_path in sorted((folder / REFERENCE).glob("seed*.json")):
        arm_path = folder / arm / stock_path.name
        if arm_path.is_file():
            found[int(stock_path.stem[len("seed") :])] = (
                json.loads(stock_path.read_text()),
                json.loads(arm_path.read_text()),
            )
    return found


def lead_curve(stock, arm):
    """(stock's updates, the arm's NLL minus stock's there): the arm's curve
    interpolated onto stock's validations, over the updates both cover."""
    stock_updates, stock_nll = nll_curve(stock)
    arm_updates, arm_nll = nll_curve(arm)
    keep = stock_updates <= arm_updates[-1]
    updates = stock_updates[keep]
    return updates, np.interp(updates, arm_updates, arm_nll) - stock_nll[keep]


def seed_figures(stock, arm, lead, margin):
    """One seed's figures (bits, updates), ``lead`` its :func:`lead_curve`."""
    updates, difference = lead
    stock_updates, stock_nll = nll_curve(stock)
    best_at = float(stock_updates[int(np.argmin(stock_nll))])
    ahead = updates[difference <= -margin]
    return {
        "lead_early": float(np.interp(EARLY, updates, difference)),
        "stock_best_update": best_at,
        "lead_at_stock_best": float(np.interp(best_at, updates, difference)),
        "best_difference": float(np.min(arm["nll"]) - np.min(stock_nll)),
        "last_ahead": float(ahead[-1]) if len(ahead) else 0.0,
    }


def summarise(results, pairs, settings, margin):
    """``[(label, pair, seeds, {figure: MeanStderr}, (grid, mean, stderr))]``,
    one row per setting and pair that has a seed with both arms."""
    rows = []
    for label, setting, arm in settings:
        for pair in pairs:
            found = seed_pairs(results, pair, setting, arm)
            if not found:
                continue
            curves = [lead_curve(stock, arm_record) for stock, arm_record in found.values()]
            figures = [
                seed_figures(stock, arm_record, curve, margin)
                for (stock, arm_record), curve in zip(found.values(), curves)
            ]
            summary = {key: mean_stderr([f[key] for f in figures]) for key in figures[0]}
            rows.append((label, pair, sorted(found), summary, band(curves)))
    return rows


def markdown(rows, margin):
    lines = [
        f"| training pairs, schedule | pair | seeds | lead at update {EARLY:,} | stock's best at update "
        "| lead at stock's best | best − stock's best | last update ahead by "
        f"≥ {margin} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, pair, seeds, s, _ in rows:
        lines.append(
            f"| {label} | {pair} | {', '.join(map(str, seeds))} | {s['lead_early'].signed(3)} | "
            f"{s['stock_best_update'].format(0, count=False)} | {s['lead_at_stock_best'].signed(3)} | "
            f"{s['best_difference'].signed(3)} | {s['last_ahead'].format(0, count=False)} |"
        )
    return "\n".join(lines)


def plot(rows, path):
    """The lead over updates (log x, from update 200), one panel per pair,
    stock's mean best update marked on each setting's line; the y-axis
    shared and fixed, a grey line at 0."""
    panels = {}
    for label, pair, _, summary, (grid, mean, stderr) in rows:
        keep = grid >= 200
        best = summary["stock_best_update"].mean
        panels.setdefault(f"Multi30k {pair}", []).append(
            (label, grid[keep], mean[keep], stderr[keep], (best, np.interp(best, grid, mean)))
        )
    fig, axes = plots.grid(panels, str(path), sharey=True)
    colors = {}
    for ax, (title, curves) in zip(axes[0], panels.items()):
        for label, x, mean, stderr, mark in curves:
            color = colors.setdefault(label, plots.color_of(len(colors)))
            ax.plot(x, mean, label=label, color=color)
            ax.fill_between(x, mean - stderr, mean + stderr, color=color, alpha=0.25, linewidth=0)
            ax.plot(*mark, "o", color=color)
        ax.set_ylim(-0.45, 0.45)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plots.pyplot().NullFormatter())
        ax.set_xlabel("training updates (dot: stock's mean best)")
        ax.set_ylabel("default − stock, valid NLL (bits)")
        ax.set_title(title, fontsize="medium")
        ax.legend(fontsize="small", loc="upper left")
    return plots.save(fig, str(path))


def is_default_selection(args):
    return (
        args.pairs == DEFAULT_PAIRS
        and args.setting == DEFAULT_SETTINGS
        and args.margin == DEFAULT_MARGIN
        and Path(args.results) == RESULTS
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", nargs="+", default=DEFAULT_PAIRS)
    setting = "LABEL=SETTING:ARM, one line each in the table and the plot"
    parser.add_argument("--setting", nargs="+", default=DEFAULT_SETTINGS, help=setting)
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="bits ahead that count as a lead (default 0.03, the issue's target)",
    )
    parser.add_argument("--results", default=str(RESULTS), help="folder holding runs/")
    parser.add_argument(
        "--out",
        help="write the table here (and the plot beside it, .png); "
        f"the default selection writes results/{TABLE_NAME}",
    )
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    settings = [parse_setting(text) for text in args.setting]
    rows = summarise(Path(args.results), args.pairs, settings, args.margin)
    if not rows:
        raise SystemExit(
            f"head_start_at_best: no seed has both {REFERENCE} and the arm under "
            f"{args.results}/runs for these settings"
        )
    table = markdown(rows, args.margin)
    print(table)
    out = args.out or (RESULTS / TABLE_NAME if is_default_selection(args) else None)
    if out is None:
        return
    out = Path(out)
    command = " ".join([".venv/bin/python research/head_start_at_best.py", *map(shlex.quote, argv)])
    png = Path(plot(rows, out.with_suffix(".png")))
    out.write_text(HEADER.format(command=command, png=png.name) + table + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
