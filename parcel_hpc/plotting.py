"""What every HTML page the toolkit writes plots with: matplotlib on Agg, a figure laid out and
encoded as a PNG data URI, labelled bars, and a plot with no data that says so in words.

Imports matplotlib only when a page plots (it is slow to import, and no other path needs it).
Must not read a search or decide what a figure shows: its callers (``accounting``'s pages, the
search report) do.
"""

from __future__ import annotations

import base64
import io
import textwrap
from collections.abc import Sequence
from typing import Any

DPI = 90
MIN_BAR = 0.01  # the narrowest bar drawn, as a share of the axis: one of 1e-5 GPU-h beside 3 stays visible
LABEL_GAP_PT = 3.0  # between a bar's end and its value
LABEL_PT = 10.0  # matplotlib's default size of an axis label


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: no display backend (a login node has none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def lay_out(fig: Any) -> None:
    """The layout a figure is saved with: every label, title and tick label inside the figure."""
    fig.tight_layout()


def png_of(fig: Any) -> str:
    """The figure as a base64 PNG for an ``<img src="data:...">`` (the page opens with no network); closes it."""
    buf = io.BytesIO()
    lay_out(fig)
    fig.savefig(buf, format="png", dpi=DPI)
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def wrapped(text: str, fig: Any) -> str:
    """``text`` broken into lines half the figure's width: an axis label is centred on its axes,
    which wide tick labels push right, so a full-width line would run off the figure."""
    chars = int(fig.get_figwidth() * 72 / 2 / (0.6 * LABEL_PT))  # an average glyph is ~0.6 em wide
    return "\n".join(textwrap.wrap(text, max(20, chars)))


def nothing_to_show(ax: Any, words: str) -> None:
    """An empty plot says why in words instead of showing empty axes."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, words, ha="center", va="center", transform=ax.transAxes, wrap=True)


def hbars(ax: Any, labels: Sequence[str], values: Sequence[float], texts: Sequence[str], color: str | Sequence[str] = "#4477aa") -> None:
    """Horizontal bars, each labelled with its value in words, on an axis fitted to the largest
    value (a share of a large cap stays readable however small) and wide enough for every label;
    a value too small to see is drawn at ``MIN_BAR`` of the axis (its label says what it is); a
    plot with nothing says so."""
    if not labels:
        nothing_to_show(ax, "nothing to show")
        return
    top = max(values) or 1.0
    shown = [max(v, top * MIN_BAR) if v > 0 else 0.0 for v in values]
    ax.barh(list(labels), shown, color=color)
    for i, text in enumerate(texts):
        ax.annotate(text, (shown[i], i), xytext=(LABEL_GAP_PT, 0), textcoords="offset points", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.6)  # room for the labels
    _fit_labels(ax, shown)


def _fit_labels(ax: Any, ends: Sequence[float]) -> None:
    """Widen the x-axis until each bar's label ends inside it: a label is offset in points, so
    where it ends in data units depends on the axis' own scale."""
    fig = ax.figure
    lay_out(fig)
    renderer = fig.canvas.get_renderer()
    width = ax.get_window_extent(renderer).width
    right = ax.get_xlim()[1]
    for end, text in zip(ends, ax.texts):
        room = width * 0.98 - text.get_window_extent(renderer).width - LABEL_GAP_PT * fig.dpi / 72
        if room > 0:
            right = max(right, end * width / room)
    ax.set_xlim(0, right)
