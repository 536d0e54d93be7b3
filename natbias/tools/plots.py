"""The analysis tools' figures (matplotlib, Agg backend): each function takes
computed numbers and writes one PNG."""

import functools
import logging
import math
import os
import textwrap
from typing import Optional

from natbias.errors import NaturalBiasError

PLOTS_EXTRA = "matplotlib draws the figures: pip install 'fairseq-natbias[plots]'"


@functools.cache
def pyplot():
    """matplotlib.pyplot on the Agg backend, imported when a figure is drawn
    first, so that the tools start (and print their numbers) without it."""
    # fairseq's import sets the root logger to DEBUG (a basicConfig in one of its
    # model modules); keep matplotlib's font-cache chatter out of the tools' output.
    if logging.getLogger("matplotlib").level == logging.NOTSET:
        logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        import matplotlib
    except ImportError:
        raise NaturalBiasError(PLOTS_EXTRA) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


PANEL_SIZE = (4.0, 3.2)


def grid(items, path: str, rows: int = 1, cols: Optional[int] = None, sharey=False):
    """A figure of ``rows`` x ``cols`` (default: one per item) panels; nothing to draw is an error."""
    if not items:
        raise NaturalBiasError(f"nothing to plot for {path}")
    cols = cols or len(items)
    return pyplot().subplots(
        rows,
        cols,
        figsize=(PANEL_SIZE[0] * cols, PANEL_SIZE[1] * rows),
        squeeze=False,
        sharey=sharey,
    )


def save(fig, path: str, title: Optional[str] = None) -> str:
    if title:
        fig.suptitle(title)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    return path


def color_of(index: int):
    return pyplot().get_cmap("tab10")(index % 10)


def _label_colors(labels) -> dict:
    """One colour per label (init), the same in every panel."""
    colors = {}
    for label in labels:
        colors.setdefault(label, color_of(len(colors)))
    return colors


def errorbar_panels(
    panels: dict[str, list[tuple[str, float, float]]],
    ylabel: str,
    path: str,
    min_span: Optional[float] = None,
    title: Optional[str] = None,
) -> str:
    """``panels[dataset] = [(init, mean, stderr), ...]``: a point with a standard-error
    bar per init; with ``min_span`` every y-axis spans at least that much (Fig. 2)."""
    fig, axes = grid(panels, path)
    colors = _label_colors(p[0] for points in panels.values() for p in points)
    for ax, (dataset, points) in zip(axes[0], panels.items()):
        for i, (label, mean, stderr) in enumerate(points):
            err = stderr if math.isfinite(stderr) else 0.0
            ax.errorbar([i], [mean], yerr=[err], fmt="o", capsize=4, color=colors[label])
        ax.set_xticks(range(len(points)), [p[0] for p in points])
        ax.set_xlim(-0.6, len(points) - 0.4)
        ax.set_title(dataset)
        ax.set_ylabel(ylabel)
        if min_span:
            _widen(ax, points, min_span)
    return save(fig, path, title)


def _widen(ax, points, min_span):
    lows = [m - (s if math.isfinite(s) else 0) for _, m, s in points]
    highs = [m + (s if math.isfinite(s) else 0) for _, m, s in points]
    low, high = min(lows), max(highs)
    margin = 0.1 * (high - low)
    low, high = low - margin, high + margin
    if high - low < min_span:
        middle = (low + high) / 2
        low, high = middle - min_span / 2, middle + min_span / 2
    ax.set_ylim(low, high)


# characters per line of a panel's title (long ones are wrapped to fit)
PANEL_TITLE_WIDTH = 40


def curve_panels(panels: dict[str, list[dict]], ylabel: str, path: str, logx: bool = True) -> str:
    """``panels[dataset] = [{"label", "x", "mean", "low", "high"}, ...]``: one
    line per init, low..high shaded."""
    fig, axes = grid(panels, path)
    colors = _label_colors(c["label"] for curves in panels.values() for c in curves)
    for ax, (dataset, curves) in zip(axes[0], panels.items()):
        for curve in curves:
            color = colors[curve["label"]]
            ax.plot(curve["x"], curve["mean"], label=curve["label"], color=color)
            ax.fill_between(
                curve["x"], curve["low"], curve["high"], color=color, alpha=0.25, linewidth=0
            )
        if logx:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(pyplot().NullFormatter())
        ax.set_xlabel("training updates")
        ax.set_ylabel(ylabel)
        ax.set_title(textwrap.fill(dataset, PANEL_TITLE_WIDTH), fontsize="medium")
        ax.legend(fontsize="small")
    return save(fig, path)
