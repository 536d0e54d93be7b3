"""Summarising the finished runs (their records, :func:`study.runs.collect_runs`):
means and standard errors over seeds, updates to reach stock's validation
NLL (at the end, at its best, or by horizon), differences between arms, the
Markdown tables, and the plots of the validation curves."""

import math

import numpy as np

# The first update at or below a target NLL, interpolated: the transformers
# examples' report (examples/huggingface/report.py) holds the one definition.
from report import reach

from natbias.tools import alc, plots
from natbias.tools.stats import mean_stderr

from .arms import CONVERGE_TEST_SETS, REFERENCE_ARM
from .runs import bleu_curve, nll_curve

# --converge's NLL plot has a second panel from this update on.
ZOOM_FROM = 2000


def zoom_start(lines):
    """Where the zoomed panel starts: update ZOOM_FROM, or a quarter of the
    longest run where that is earlier (a short, small-corpus budget)."""
    longest = max(float(line["x"][-1]) for line in lines if len(line["x"]))
    return min(ZOOM_FROM, int(longest) // 4)


def from_update(line, first):
    """A plotted line (see :func:`summarise`) from update ``first`` on."""
    keep = np.asarray(line["x"]) >= first
    return {
        key: (np.asarray(value)[keep] if key != "label" else value) for key, value in line.items()
    }


def band_of(values):
    """Standard error over seeds (rows) of each column; 0 for one seed."""
    if len(values) < 2:
        return np.zeros(values.shape[1])
    return values.std(0, ddof=1) / np.sqrt(len(values))


def plotted(label, x, mean, error):
    """A line of :func:`natbias.tools.plots.curve_panels`: mean ± error shaded."""
    return {"label": label, "x": x, "mean": mean, "low": mean - error, "high": mean + error}


def band(curves):
    """Mean ± standard error over seeds on the first run's grid."""
    grid = curves[0][0]
    stacked = np.array([np.interp(grid, u, v) for u, v in curves])
    return grid, stacked.mean(0), band_of(stacked)


def summarise(task, runs, converge=False):
    """Rows of the table and the curves of the plots, over the records of
    finished runs (``{arm: [record, ...]}``, :func:`collect_runs`). The
    target of "updates to reach" is stock's validation NLL at its last
    update, or, with ``converge``, at its best."""
    reference = next((records for arm, records in runs.items() if arm.name == REFERENCE_ARM), None)
    pick = np.min if converge else (lambda values: values[-1])
    target = float(np.mean([pick(nll_curve(r)[1]) for r in reference])) if reference else None
    with_bleu_curves = task.name == "translation" and not converge
    rows, nll_lines, bleu_lines = [], [], []
    for arm, records in runs.items():
        nll = [nll_curve(r) for r in records]
        bleu = [bleu_curve(r) for r in records] if with_bleu_curves else []
        scores = [r["scores"] for r in records]
        step0 = [r["step0"] for r in records]
        gains = [r["gain"] for r in records if r["gain"] is not None]
        compared = compared_values(nll, bleu, scores, task, converge)
        row = {
            "arm": arm.name,
            "n": len(records),
            "step0": mean_stderr([v[0] for _, v in nll]),
            "unigram_ce": (
                mean_stderr([s["unigram_ce"] for s in step0])
                if all("unigram_ce" in s for s in step0)
                else None
            ),
            "reach": [reach(r, target) for r in records] if target is not None else [],
            "final_update": int(nll[0][0][-1]),
            "final_nll": mean_stderr([v[-1] for _, v in nll]),
            "gain": mean_stderr(gains) if gains else None,
        }
        if converge:
            row["best_update"] = [int(u[np.argmin(v)]) for u, v in nll]
            row["last_update"] = [int(u[-1]) for u, _ in nll]
        if task.name == "translation":
            row["chrf"] = mean_stderr([s["chrf"] for s in scores])
            row["signatures"] = (scores[0]["bleu_signature"], scores[0]["chrf_signature"])
            for test_set in task.extra_test_sets:
                row[f"chrf_{test_set}"] = mean_stderr([s[f"chrf_{test_set}"] for s in scores])
        else:
            row["test_nll"] = mean_stderr([s["nll"] for s in scores])
        if with_bleu_curves:
            row["final_bleu"] = mean_stderr([v[-1] for _, v in bleu])
        row.update({key: mean_stderr(values) for key, values in compared.items()})
        seeds = [record.get("seed") for record in records]
        row["per_seed"] = {key: dict(zip(seeds, values)) for key, values in compared.items()}
        rows.append(row)
        for lines, curves in ((nll_lines, nll), (bleu_lines, bleu)):
            if not curves:
                continue
            lines.append(plotted(arm.name, *band(curves)))
    return rows, target, nll_lines, bleu_lines


def compared_values(nll, bleu, scores, task, converge):
    """``{quantity: [value per seed]}`` of the quantities the differences
    under a table compare (:func:`comparisons`): the row's mean ± s.e. of
    each, and its values by seed for pairing two arms."""
    values = {"alc": [alc.area_under_learning_curve(u, v).alc for u, v in nll]}
    if converge:
        values["best_nll"] = [float(np.min(v)) for _, v in nll]
    if bleu:
        values["alc_bleu"] = [alc.area_under_learning_curve(u, v).alc for u, v in bleu]
    if task.name == "translation":
        values["bleu"] = [s["bleu"] for s in scores]
        for test_set in task.extra_test_sets:
            values[f"bleu_{test_set}"] = [s[f"bleu_{test_set}"] for s in scores]
    else:
        values["test_ppl"] = [s["ppl"] for s in scores]
    return values


def table_head(title, columns, translation_columns, translation):
    """A study table's title and header: ``columns``, then the test scores
    (``translation_columns`` for translation, eval-lm's for a language model)
    and the gain."""
    lm_columns = ["test NLL (eval-lm)", "test perplexity"]
    columns = [*columns, *(translation_columns if translation else lm_columns), "gain g at the end"]
    return [f"### {title}", "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def reach_cell(row):
    return ", ".join("never" if r == float("inf") else f"{r:.0f}" for r in row["reach"])


def table_rows(rows, cells_of):
    """A row a run summary (its gain last), then the validation targets' unigram."""
    out = []
    for row in rows:
        cells = [*cells_of(row), row["gain"].format(2) if row["gain"] else ""]
        out.append("| " + " | ".join(cells) + " |")
    ce = [row["unigram_ce"] for row in rows if row["unigram_ce"]]
    if ce:
        out += ["", f"Unigram cross-entropy of the validation targets: {ce[0].mean:.3f} bits."]
    return out


def markdown(rows, target, title):
    reach_head = (
        f"updates to reach stock's valid NLL at its last update ({target:.3f}), per seed"
        if target is not None
        else "updates to reach stock"
    )
    translation = bool(rows) and "bleu" in rows[0]
    columns = ["arm", "n", "valid NLL at update 0", "ALC of valid NLL"]
    columns += ["ALC of valid BLEU (greedy)"] if translation else []
    columns += [reach_head, "valid NLL at the end"]
    bleu_columns = ["valid BLEU at the end (greedy)", "test BLEU", "test chrF"]
    out = table_head(title, columns, bleu_columns, translation)

    def cells_of(row):
        cells = [row["arm"], str(row["n"]), row["step0"].format(3), row["alc"].format(3)]
        cells += [row["alc_bleu"].format(2)] if translation else []
        cells += [reach_cell(row), row["final_nll"].format(3)]
        if translation:
            return cells + [row[k].format(2) for k in ("final_bleu", "bleu", "chrf")]
        return cells + [row["test_nll"].format(3), row["test_ppl"].format(2)]

    out += table_rows(rows, cells_of)
    if rows:
        out += [f"Updates per run: {rows[0]['final_update']}. Mean ± standard error over seeds."]
    if translation:
        out += [
            f"test BLEU signature: `{rows[0]['signatures'][0]}`; chrF: `{rows[0]['signatures'][1]}`"
        ]
    return "\n".join(out + comparisons(rows)) + "\n"


HORIZONS = (1000, 2000, 4000, 6000, 8000, 10000, 12000, 16000, 20000, 30000)


def reach_by_horizon(runs):
    """For each arm but stock and each horizon h (within every stock run):
    the updates it needs to reach stock's mean validation NLL at update h,
    as a fraction of h, one value per seed; ``{arm name: (horizons,
    ratios[seed][horizon])}``. Shows whether the head start lasts. ``runs``
    as for :func:`summarise`."""
    stock = [
        nll_curve(r) for arm, records in runs.items() if arm.name == REFERENCE_ARM for r in records
    ]
    horizons = [h for h in HORIZONS if stock and h <= min(u[-1] for u, _ in stock)]
    if not horizons:  # no stock run, or stock's runs shorter than the first horizon
        return {}
    targets = [float(np.mean([np.interp(h, u, v) for u, v in stock])) for h in horizons]
    return {
        arm.name: (
            horizons,
            np.array([[reach(r, t) / h for h, t in zip(horizons, targets)] for r in records]),
        )
        for arm, records in runs.items()
        if arm.name != REFERENCE_ARM
    }


def markdown_reach_by_horizon(found):
    if not found:
        return ""
    horizons = next(iter(found.values()))[0]
    out = [
        "",
        "Updates to reach stock's validation NLL at update h, as a fraction of h "
        "(mean over seeds; 1 = no head start):",
        "",
        "| arm | " + " | ".join(f"h = {h}" for h in horizons) + " |",
        "|---" * (len(horizons) + 1) + "|",
    ]
    for name, (_, ratios) in found.items():
        out.append(f"| {name} | " + " | ".join(horizon_cell(column) for column in ratios.T) + " |")
    return "\n".join(out) + "\n"


def reach_line(name, horizons, ratios):
    """One arm's reach-by-horizon curve, mean ± s.e. over seeds, drawn only
    at the horizons every seed reached (the table shows the others)."""
    reached = np.isfinite(ratios).all(0)
    ratios = ratios[:, reached]
    x = [h for h, ok in zip(horizons, reached) if ok]
    return plotted(name, x, ratios.mean(0), band_of(ratios))


def horizon_cell(ratios):
    """Mean ± s.e. over seeds; where a seed never reached stock (inf), the
    seeds one by one instead, since a mean with inf in it says nothing."""
    if np.isfinite(ratios).all():
        return mean_stderr(list(ratios)).format(2, count=False)
    return ", ".join("never" if np.isinf(r) else f"{r:.2f}" for r in ratios)


def markdown_converged(rows, target, title, test_sets, patience=6):
    """The table of a --converge study: best validation NLL, when each run got
    there and stopped, and test scores of the best checkpoint on each test set."""
    reach_head = (
        f"updates to reach stock's best valid NLL ({target:.3f}), per seed"
        if target is not None
        else "updates to reach stock's best"
    )
    translation = bool(rows) and "bleu" in rows[0]
    columns = [
        "arm",
        "n",
        "valid NLL at update 0",
        reach_head,
        "best valid NLL",
        "update of the best, per seed",
        "last update (stopped), per seed",
    ]
    test_columns = [f"{name} {metric}" for name in test_sets for metric in ("BLEU", "chrF")]
    out = table_head(title, columns, test_columns, translation)

    def cells_of(row):
        cells = [row["arm"], str(row["n"]), row["step0"].format(3), reach_cell(row)]
        cells += [row["best_nll"].format(3), ", ".join(map(str, row["best_update"]))]
        cells += [", ".join(map(str, row["last_update"]))]
        if not translation:
            return cells + [row["test_nll"].format(3), row["test_ppl"].format(2)]
        for index, name in enumerate(test_sets):
            suffix = "" if index == 0 else f"_{name}"
            cells += [row[f"bleu{suffix}"].format(2), row[f"chrf{suffix}"].format(2)]
        return cells

    out += table_rows(rows, cells_of)
    stop = (
        f"Each run stopped when its validation NLL had not improved for {patience} "
        "validations (fairseq's --patience) or at the update cap"
        if patience > 0
        else "Each run trained for the same budget of updates (no --patience; a run that "
        "an earlier patience had stopped was resumed to it)"
    )
    scored = "beam 5" if translation else "by fairseq-eval-lm on the test set"
    out += [
        f"{stop}; its best checkpoint (lowest validation NLL) is scored, {scored}. "
        "Mean ± standard error over seeds."
    ]
    if translation:
        out += [f"BLEU signature: `{rows[0]['signatures'][0]}`; chrF: `{rows[0]['signatures'][1]}`"]
    reference = next((row for row in rows if row["arm"] == REFERENCE_ARM), None)
    stock_best = float(np.mean(reference["best_update"])) if reference else None
    return "\n".join(out + comparisons(rows, stock_best)) + "\n"


# Pairs of arms compared in the text under the table: the bias under one weight
# init, the default and the paper's model (the bias on fairseq's weights)
# against stock fairseq, and the default against the paper's model.
COMPARED = (
    ("gain/unigram", "gain/zero"),
    ("fairseq/unigram", "fairseq/zero"),
    ("gain/unigram", "stock"),
    ("gain/zero", "stock"),
    ("fairseq/unigram", "stock"),
    ("gain/unigram", "fairseq/unigram"),
)


def difference(a, b, key):
    """Arm ``a`` minus arm ``b`` in one quantity, and the text of its spread.
    Paired by seed where the two share two seeds or more: a study's arms
    see the same seed's batches in the same order (fairseq shuffles by seed
    and epoch, not by model), so a seed's two runs are not independent, and
    the mean of the per-seed differences with its own standard error is the
    estimate that counts (the issue's targets are paired); one seed in
    common gives that seed's difference alone. Rows without seeds: the
    difference of the means, with sqrt(se_a^2 + se_b^2)."""
    seeds_a, seeds_b = a.get("per_seed", {}).get(key, {}), b.get("per_seed", {}).get(key, {})
    common = [seed for seed in seeds_a if seed is not None and seed in seeds_b]
    if len(common) >= 2:
        paired = mean_stderr([seeds_a[seed] - seeds_b[seed] for seed in common])
        size = f", {paired.mean / paired.stderr:.1f} s.e." if paired.stderr > 0 else ""
        return paired.mean, f" (paired over {len(common)} seeds, s.e. {paired.stderr:.3f}{size})"
    if len(common) == 1:
        seed = common[0]
        return seeds_a[seed] - seeds_b[seed], f" (seed {seed} only: no s.e.)"
    x, y = a[key], b[key]
    se = math.sqrt(x.stderr**2 + y.stderr**2)  # nan with a single seed
    spread = (
        f" (s.e. {se:.3f}, {(x.mean - y.mean) / se:.1f} s.e.)"
        if math.isfinite(se) and se > 0
        else " (one seed: no s.e.)"
    )
    return x.mean - y.mean, spread


def comparisons(rows, reference_updates=None):
    """Differences between arms (:func:`difference`: paired by seed where
    they can be), and the mean ratio of updates
    to reach stock's last validation NLL to the updates of a run, or, given
    ``reference_updates`` (a --converge study), to stock's mean update of its
    best validation NLL."""
    by_arm = {row["arm"]: row for row in rows}
    test_sets = sorted(
        key[len("bleu_") :] for key in (rows[0] if rows else {}) if key.startswith("bleu_")
    )
    keys = (
        ("alc_bleu", "ALC of valid BLEU"),
        ("bleu", "test BLEU"),
        *((f"bleu_{t}", f"{t} BLEU") for t in test_sets),
        ("test_ppl", "test ppl"),
        ("alc", "ALC of valid NLL"),
        ("best_nll", "best valid NLL"),
    )
    lines = []
    for a, b in COMPARED:
        if a not in by_arm or b not in by_arm:
            continue
        parts = []
        for key, label in keys:
            if key not in by_arm[a]:
                continue
            value, spread = difference(by_arm[a], by_arm[b], key)
            parts.append(f"{label} {value:+.3f}{spread}")
        reached = [r for r in by_arm[a]["reach"] if math.isfinite(r)]
        if reached:
            span = reference_updates or by_arm[a]["final_update"]
            of = f"stock's {span:.0f} to its best" if reference_updates else f"{span}"
            parts.append(
                f"updates to reach stock: {np.mean(reached) / span:.2f}x of {of}"
                + ("" if len(reached) == len(by_arm[a]["reach"]) else " (some never)")
            )
        lines.append(f"- {a} − {b}: " + "; ".join(parts))
    return ["", "Differences:"] + lines if lines else []


def write_table_and_plots(task, runs, title, study_dir, converge=False, patience=6):
    """The study's table (returned) and plots, written to ``study_dir``:
    study.md, study_valid_nll.png, study_valid_bleu.png (translation, not
    --converge) and, with ``converge``, study_reach_by_horizon.png; returns
    the table and ``{kind: path}`` of what was written."""
    rows, target, nll_lines, bleu_lines = summarise(task, runs, converge)
    if not rows:
        raise SystemExit("study: no finished run yet")
    table = (
        markdown_converged(rows, target, title, CONVERGE_TEST_SETS, patience)
        if converge
        else markdown(rows, target, title)
    )
    outputs = {"md": study_dir / "study.md", "nll": study_dir / "study_valid_nll.png"}
    if converge:
        found = reach_by_horizon(runs)
        table += markdown_reach_by_horizon(found)
        if found:
            outputs["reach"] = study_dir / "study_reach_by_horizon.png"
            lines = [
                reach_line(name, *horizons_and_ratios)
                for name, horizons_and_ratios in found.items()
            ]
            plots.curve_panels(
                {title: lines}, "updates to reach stock at h / h", str(outputs["reach"])
            )
    outputs["md"].write_text(table)
    nll_panels = {title: nll_lines}
    if converge:  # the end of a long run, where the arms differ by hundredths
        zoom = zoom_start(nll_lines)
        nll_panels[f"from update {zoom:,}"] = [from_update(line, zoom) for line in nll_lines]
    plots.curve_panels(nll_panels, "validation NLL (bits/token)", str(outputs["nll"]), logx=False)
    if bleu_lines:
        outputs["bleu"] = study_dir / "study_valid_bleu.png"
        plots.curve_panels(
            {title: bleu_lines}, "validation BLEU (greedy)", str(outputs["bleu"]), logx=False
        )
    return table, outputs
