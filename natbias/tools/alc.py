"""Area under the validation learning curve (ALC), the paper's efficiency
measure (Meister et al., 2023, sec. 4.2 and footnote 9): the composite
trapezoidal rule over the validation points ``(u_i, y_i)`` up to ``K``
updates, renormalised by the span covered::

    ALC = sum_i (u_{i+1} - u_i) (y_i + y_{i+1}) / 2  /  (u_last - u_first)

The point at ``K`` is interpolated when the run was validated beyond it.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from natbias.errors import NaturalBiasError
from natbias.tools import fairseq_logs
from natbias.tools.runs import LOG_NAME

PAPER_MAX_UPDATES = 20000


@dataclass
class AlcResult:
    alc: float
    area: float
    first_update: float
    last_update: float
    points: int
    covers_max_updates: bool


def area_under_learning_curve(
    updates: Sequence[float], values: Sequence[float], max_updates: Optional[float] = None
) -> AlcResult:
    """ALC of one curve over its first ``max_updates`` updates (None: all of it)."""
    x = np.asarray(updates, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise NaturalBiasError("updates and values must be two sequences of equal length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise NaturalBiasError("the learning curve holds non-finite values (inf or nan)")
    if np.any(np.diff(x) <= 0):
        raise NaturalBiasError("updates must be strictly increasing")
    covers = True
    if max_updates is not None:
        x, y, covers = _clip(x, y, float(max_updates))
    if len(x) < 2:
        raise NaturalBiasError(
            f"the learning curve has {len(x)} validation point(s) within the first "
            f"{max_updates or 'all'} updates; the area under it needs at least two "
            "(validate more often: fairseq-train --validate-interval-updates N)"
        )
    area = float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))
    return AlcResult(area / (x[-1] - x[0]), area, float(x[0]), float(x[-1]), len(x), covers)


def _clip(x, y, limit):
    """The curve on [x_0, limit], the point at ``limit`` interpolated if the curve goes beyond."""
    inside = x <= limit
    if not inside.any():
        raise NaturalBiasError(
            f"the first validation is at update {int(x[0])}, after the first "
            f"{int(limit)} updates the ALC is asked for"
        )
    cx, cy = x[inside], y[inside]
    beyond = np.flatnonzero(~inside)
    if cx[-1] == limit:
        return cx, cy, True
    if len(beyond) == 0:
        return cx, cy, False
    nxt = beyond[0]
    at_limit = np.interp(limit, [x[nxt - 1], x[nxt]], [y[nxt - 1], y[nxt]])
    return np.append(cx, limit), np.append(cy, at_limit), True


def log_path(path: str) -> str:
    """A log file, or a run directory holding ``train.log``."""
    if os.path.isdir(path):
        candidate = os.path.join(path, LOG_NAME)
        if not os.path.isfile(candidate):
            raise NaturalBiasError(f"{path}: a directory without {LOG_NAME}")
        return candidate
    return path


def alc_of_log(
    path: str,
    metric: str = "bleu",
    max_updates: Optional[float] = PAPER_MAX_UPDATES,
    subset: str = fairseq_logs.VALID,
) -> AlcResult:
    """ALC of the validation ``metric`` (any key of fairseq's validation lines) in one log."""
    path = log_path(path)
    records = fairseq_logs.read_log(path)
    updates, values = fairseq_logs.validation_series(records, path, metric, subset)
    try:
        return area_under_learning_curve(updates, values, max_updates)
    except NaturalBiasError as error:
        raise NaturalBiasError(f"{path}: {error}") from None


def format_alc(result: AlcResult) -> str:
    note = "" if result.covers_max_updates else " (run stops before the limit)"
    return (
        f"{result.alc:.4f}  over updates {int(result.first_update)}-"
        f"{int(result.last_update)}, {result.points} points{note}"
    )
