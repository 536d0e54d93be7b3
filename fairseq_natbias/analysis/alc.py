"""Area under the validation learning curve (ALC), the paper's efficiency measure.

Meister et al. (2023), sec. 4.2: "we estimate the area under the validation
BLEU learning curve (ALC) (Guyon et al., 2011; Liu et al., 2020) for the first
20k training updates; for the sake of interpretability, scores are renormalised
by the interval span." Footnote 9: "Explicitly, we use the composite
trapezoidal rule."

Here, for validation points ``(u_i, y_i)`` (``u`` = ``num_updates`` of fairseq's
validation lines) up to ``K`` updates::

    ALC = sum_i (u_{i+1} - u_i) (y_i + y_{i+1}) / 2  /  (u_last - u_first)

The curve is the piecewise-linear interpolation of the validation points, so
when the run was validated beyond ``K`` but not exactly at ``K``, the point at
``K`` is interpolated and the curve stops there. The span is the one the
validation points cover (fairseq does not validate at update 0): ``u_first`` is
the first validation, ``u_last`` is ``K`` or the last validation before it if
the run stopped earlier (``AlcResult.covers_max_updates`` says which).
"""

import os
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from fairseq_natbias.analysis import AnalysisError
from fairseq_natbias.analysis import fairseq_logs

PAPER_MAX_UPDATES = 20000
RUN_LOG_NAME = "train.log"


@dataclass
class AlcResult:
    alc: float
    area: float
    first_update: float
    last_update: float
    points: int
    covers_max_updates: bool


def trapezoid_area(x: np.ndarray, y: np.ndarray) -> float:
    """Composite trapezoidal rule over the points (x_i, y_i)."""
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))


def area_under_learning_curve(
    updates: Sequence[float], values: Sequence[float], max_updates: Optional[float] = None
) -> AlcResult:
    """ALC of one learning curve over its first ``max_updates`` updates (all of
    it for None), divided by the span of updates covered."""
    x = np.asarray(updates, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    _check_curve(x, y)
    covers = True
    if max_updates is not None:
        x, y, covers = _clip(x, y, float(max_updates))
    if len(x) < 2:
        raise AnalysisError(
            f"the learning curve has {len(x)} validation point(s) within the first "
            f"{max_updates or 'all'} updates; the area under it needs at least two "
            "(validate more often: fairseq-train --validate-interval-updates N)"
        )
    area = trapezoid_area(x, y)
    return AlcResult(area / (x[-1] - x[0]), area, float(x[0]), float(x[-1]), len(x), covers)


def _check_curve(x, y):
    if x.shape != y.shape or x.ndim != 1:
        raise AnalysisError("updates and values must be two sequences of equal length")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise AnalysisError("the learning curve holds non-finite values (inf or nan)")
    if np.any(np.diff(x) <= 0):
        raise AnalysisError("updates must be strictly increasing")


def _clip(x, y, limit):
    """The curve on [x_0, limit], with the point at ``limit`` interpolated when
    the curve goes beyond it."""
    inside = x <= limit
    if not inside.any():
        raise AnalysisError(
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
        candidate = os.path.join(path, RUN_LOG_NAME)
        if not os.path.isfile(candidate):
            raise AnalysisError(f"{path}: a directory without {RUN_LOG_NAME}")
        return candidate
    return path


def alc_of_log(
    path: str, metric: str = "bleu", max_updates: Optional[float] = PAPER_MAX_UPDATES,
    subset: str = fairseq_logs.VALID,
) -> AlcResult:
    """ALC of the validation ``metric`` (``bleu``, ``chrf``, ``loss``, any key
    of fairseq's validation lines) in one fairseq-train log."""
    path = log_path(path)
    records = fairseq_logs.read_log(path)
    updates, values = fairseq_logs.validation_series(records, path, metric, subset)
    try:
        return area_under_learning_curve(updates, values, max_updates)
    except AnalysisError as error:
        raise AnalysisError(f"{path}: {error}") from None


def format_alc(result: AlcResult) -> str:
    note = "" if result.covers_max_updates else " (run stops before the limit)"
    return (f"{result.alc:.4f}  over updates {int(result.first_update)}-"
            f"{int(result.last_update)}, {result.points} points{note}")
