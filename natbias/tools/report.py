"""Report over a run grid (:mod:`natbias.tools.runs`): test BLEU and chrF (the
paper's Figs. 2 and 9) and the ALC of validation BLEU/chrF (Figs. 3 and 10), as
mean and standard error over seeds per dataset and bias initialisation, written
as ``report.md``, ``runs.tsv`` and one PNG per figure that has numbers.
"""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from natbias.errors import NaturalBiasError
from natbias.tools import alc, fairseq_logs, plots, runs
from natbias.tools.stats import MeanStderr, mean_stderr

METRICS = ("bleu", "chrf")
METRIC_LABELS = {"bleu": "BLEU", "chrf": "chrF"}
MIN_SPAN = 0.5  # Fig. 2: "the y-axis spans at least 0.5 BLEU"


@dataclass
class RunSummary:
    run: runs.Run
    test: dict[str, Optional[runs.Score]] = field(default_factory=dict)
    alc: dict[str, Optional[float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass
class GroupSummary:
    dataset: str
    init: str
    seeds: list[int]
    test: dict[str, MeanStderr]
    alc: dict[str, MeanStderr]


@dataclass
class Report:
    max_updates: Optional[int]
    runs: list[RunSummary]
    groups: list[GroupSummary]

    def problems(self) -> list[str]:
        return [p for summary in self.runs for p in summary.problems]

    def signatures(self, metric: str) -> list[str]:
        return sorted(
            {
                s.test[metric].signature
                for s in self.runs
                if s.test.get(metric) and s.test[metric].signature
            }
        )


def summarise_run(run: runs.Run, max_updates: Optional[int]) -> RunSummary:
    summary = RunSummary(run)
    for metric in METRICS:
        summary.test[metric] = runs.read_test_score(run.path, metric)
    if summary.test["bleu"] is None:
        summary.problems.append(f"{run.path}: no test BLEU ({runs.SCORE_FILES['bleu']})")
    if not os.path.isfile(run.log):
        summary.problems.append(f"{run.path}: no {runs.LOG_NAME}; no ALC")
        return summary
    records = fairseq_logs.read_log(run.log)
    logged = fairseq_logs.available_keys(records, fairseq_logs.VALID)
    for metric in METRICS:
        if metric == "chrf" and metric not in logged:
            continue  # fairseq's --eval-bleu logs BLEU only; chrF only if a task logs it
        summary.alc[metric] = _run_alc(records, run.log, metric, max_updates, summary.problems)
    return summary


def _run_alc(records, path, metric, max_updates, problems) -> Optional[float]:
    try:
        updates, values = fairseq_logs.validation_series(records, path, metric)
        return alc.area_under_learning_curve(updates, values, max_updates).alc
    except NaturalBiasError as error:
        problems.append(f"{path}: no ALC of {metric}: {error}")
        return None


def summarise_group(dataset: str, init: str, members: Sequence[RunSummary]) -> GroupSummary:
    def collect(getter):
        values = (getter(m) for m in members)
        return mean_stderr([v for v in values if v is not None and math.isfinite(v)])

    test = {m: collect(lambda s, m=m: s.test[m].value if s.test.get(m) else None) for m in METRICS}
    curve = {m: collect(lambda s, m=m: s.alc.get(m)) for m in METRICS}
    return GroupSummary(dataset, init, [m.run.seed for m in members], test, curve)


def build_report(
    roots: Sequence[str], max_updates: Optional[int] = alc.PAPER_MAX_UPDATES, progress=None
) -> Report:
    all_runs = runs.discover_runs(roots)
    summaries = []
    for i, run in enumerate(all_runs, start=1):
        if progress:
            progress(f"[{i}/{len(all_runs)}] {run.path}")
        summaries.append(summarise_run(run, max_updates))
    by_group: dict[tuple, list[RunSummary]] = {}
    for summary in summaries:  # runs come sorted by dataset, init, seed
        by_group.setdefault((summary.run.dataset, summary.run.init), []).append(summary)
    groups = [summarise_group(d, i, members) for (d, i), members in by_group.items()]
    report = Report(max_updates, summaries, groups)
    if not any(g.test[m].n or g.alc[m].n for g in groups for m in METRICS):
        raise NaturalBiasError(
            "no test scores and no validation curves in any run:\n  "
            + "\n  ".join(report.problems())
        )
    return report


def markdown(report: Report) -> str:
    limit = report.max_updates or "all"
    header = [
        "dataset",
        "init",
        "seeds",
        "test BLEU",
        "test chrF",
        f"ALC BLEU (first {limit} updates)",
        f"ALC chrF (first {limit} updates)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for g in report.groups:
        cells = [
            g.dataset,
            g.init,
            str(len(g.seeds)),
            g.test["bleu"].format(2),
            g.test["chrf"].format(2),
            g.alc["bleu"].format(2),
            g.alc["chrf"].format(2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Mean ± standard error over seeds (n = seeds with that number). "
        "ALC: area under the validation curve by the composite trapezoidal "
        "rule, divided by the span of updates covered."
    )
    for metric in METRICS:
        for signature in report.signatures(metric):
            lines.append(f"\nsacreBLEU {METRIC_LABELS[metric]} signature: `{signature}`")
    problems = report.problems()
    if problems:
        lines.append("\nMissing or unusable inputs:\n")
        lines.extend(f"- {p}" for p in problems)
    return "\n".join(lines) + "\n"


def runs_tsv(report: Report) -> str:
    rows = ["dataset\tinit\tseed\ttest_bleu\ttest_chrf\talc_bleu\talc_chrf\tpath"]
    for s in report.runs:
        values = [s.test[m].value if s.test.get(m) else None for m in METRICS]
        values += [s.alc.get(m) for m in METRICS]
        cells = ["" if v is None else f"{v:.4f}" for v in values]
        rows.append("\t".join([s.run.dataset, s.run.init, str(s.run.seed), *cells, s.run.path]))
    return "\n".join(rows) + "\n"


FIGURES = (
    ("test", "bleu", "test_bleu.png", "test BLEU", "Fig. 2: mean test BLEU"),
    ("test", "chrf", "test_chrf.png", "test chrF", "Fig. 9: mean test chrF"),
    ("alc", "bleu", "alc_bleu.png", "ALC of validation BLEU", "Fig. 3: ALC, validation BLEU"),
    ("alc", "chrf", "alc_chrf.png", "ALC of validation chrF", "Fig. 10: ALC, validation chrF"),
)


def write_report(report: Report, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = [os.path.join(out_dir, "report.md"), os.path.join(out_dir, "runs.tsv")]
    Path(written[0]).write_text(markdown(report), encoding="utf-8")
    Path(written[1]).write_text(runs_tsv(report), encoding="utf-8")
    for kind, metric, name, ylabel, title in FIGURES:
        panels: dict[str, list] = {}
        for g in report.groups:
            if (value := getattr(g, kind)[metric]).n:
                panels.setdefault(g.dataset, []).append((g.init, value.mean, value.stderr))
        if panels:
            span = MIN_SPAN if kind == "test" else None
            written.append(
                plots.errorbar_panels(
                    panels, ylabel, os.path.join(out_dir, name), min_span=span, title=title
                )
            )
    return written
