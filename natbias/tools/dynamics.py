"""Training dynamics over updates, one line per bias initialisation (mean over
seeds, ± standard error shaded): the statistics of :mod:`natbias.metrics` as
fairseq's log shows them, and ``valid_bleu`` (Fig. 5); a ``valid_`` prefix
reads the validation lines, other names the ``train_inner`` lines.
"""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from natbias.errors import NaturalBiasError
from natbias.metrics import METRICS
from natbias.tools import fairseq_logs, plots, runs
from natbias.tools.stats import mean_stderr

DEFAULT_METRICS = ("kl_unigram", "kl_uniform", "bias_kl", "bias_norm", "valid_bleu")
LABELS = {name: m.label + (f" ({m.unit})" if m.unit else "") for name, m in METRICS.items()}
LABELS["valid_bleu"] = "validation BLEU"


@dataclass
class Curve:
    label: str
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    seeds: np.ndarray  # how many seeds logged each update


def aggregate_seeds(label: str, per_seed: Sequence[tuple[np.ndarray, np.ndarray]]) -> Curve:
    """Mean and mean ± standard error over seeds, update by update."""
    by_update: dict[float, list[float]] = {}
    for updates, values in per_seed:
        for u, v in zip(updates, values):
            by_update.setdefault(float(u), []).append(float(v))
    x = np.array(sorted(by_update))
    stats = [mean_stderr(by_update[u]) for u in x]
    mean = np.array([s.mean for s in stats])
    err = np.array([s.stderr if math.isfinite(s.stderr) else 0.0 for s in stats])
    return Curve(label, x, mean, mean - err, mean + err, np.array([s.n for s in stats]))


@dataclass
class Dynamics:
    curves: dict[str, dict[str, list[Curve]]]  # metric -> dataset -> curves
    notes: list[str]


def collect(grid: Sequence[runs.Run], metrics: Sequence[str]) -> Dynamics:
    """Curves of every metric for every dataset and init of the runs."""
    records, notes, groups = {}, [], {}
    for run in grid:
        if os.path.isfile(run.log):
            records[run.log] = fairseq_logs.read_log(run.log)
        else:
            notes.append(f"{run.path}: no {runs.LOG_NAME}")
        groups.setdefault((run.dataset, run.init), []).append(run)
    curves: dict[str, dict[str, list[Curve]]] = {}
    for metric in metrics:
        tag, key = fairseq_logs.split_metric(metric)
        for (dataset, init), members in groups.items():
            per_seed = [
                fairseq_logs.series(records[r.log], tag, key) for r in members if r.log in records
            ]
            per_seed = [s for s in per_seed if len(s[0])]
            if not per_seed:
                notes.append(f"{dataset}/{init}: no {metric} in the logs" + _why(metric, init))
                continue
            curves.setdefault(metric, {}).setdefault(dataset, []).append(
                aggregate_seeds(init, per_seed)
            )
    if not curves:
        raise NaturalBiasError(
            "none of " + ", ".join(metrics) + " is in any log:\n  " + "\n  ".join(notes)
        )
    return Dynamics(curves, notes)


def _why(metric, init) -> str:
    if metric.startswith("bias_") and init == "none":
        return " (a model without an output bias logs no bias statistics)"
    if metric.startswith(fairseq_logs.VALID + "_"):
        return " (no validation lines with that key; BLEU needs --eval-bleu)"
    return ""


def curves_tsv(dynamics: Dynamics) -> str:
    rows = ["metric\tdataset\tinit\tupdate\tmean\tstderr\tseeds"]
    for metric, by_dataset in dynamics.curves.items():
        for dataset, curves in by_dataset.items():
            for c in curves:
                for x, m, hi, n in zip(c.x, c.mean, c.high, c.seeds):
                    stderr = f"{hi - m:.6g}" if n > 1 else ""
                    rows.append(f"{metric}\t{dataset}\t{c.label}\t{int(x)}\t{m:.6g}\t{stderr}\t{n}")
    return "\n".join(rows) + "\n"


def write_dynamics(dynamics: Dynamics, out_dir: str, logx: bool = True) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = [os.path.join(out_dir, "dynamics.tsv")]
    Path(written[0]).write_text(curves_tsv(dynamics), encoding="utf-8")
    for metric, by_dataset in dynamics.curves.items():
        panels = {dataset: [vars(c) for c in curves] for dataset, curves in by_dataset.items()}
        written.append(
            plots.curve_panels(
                panels,
                LABELS.get(metric, metric),
                os.path.join(out_dir, f"{metric}.png"),
                logx=logx,
            )
        )
    return written
