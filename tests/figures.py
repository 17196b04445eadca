"""Figures a page shows, checked as laid out for saving (``plotting.lay_out``): every text inside
the figure, and no two tick labels of an axis on top of each other."""

from collections.abc import Iterator
from typing import Any

from matplotlib.axis import Axis
from matplotlib.text import Text

from parcel_hpc.plotting import lay_out

SLACK_PX = 1.0  # antialiasing


def unreadable(fig: Any) -> list[str]:
    """What would be cut off or overprinted in ``fig``, in words (empty: nothing)."""
    lay_out(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    problems = []
    for text in _drawn(fig):
        b = text.get_window_extent(renderer)
        if b.x0 < box.x0 - SLACK_PX or b.y0 < box.y0 - SLACK_PX or b.x1 > box.x1 + SLACK_PX or b.y1 > box.y1 + SLACK_PX:
            problems.append(f"{text.get_text()!r} at {tuple(round(v) for v in b.bounds)} leaves the figure {tuple(round(v) for v in box.bounds)}")
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = [(t.get_window_extent(renderer), t.get_text()) for t in _tick_labels(axis)]
            for i, (a, text_a) in enumerate(labels):
                problems += [f"tick labels {text_a!r} and {text_b!r} overlap" for b, text_b in labels[i + 1 :] if a.overlaps(b)]
    return problems


def _tick_labels(axis: Axis) -> Iterator[Text]:
    """The tick labels drawn: a locator also places ticks just beyond the view, which are not."""
    low, high = sorted(axis.get_view_interval())
    span = high - low
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        if low - 1e-9 * span <= tick.get_loc() <= high + 1e-9 * span:
            yield from (label for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text().strip())


def _drawn(fig: Any) -> Iterator[Text]:
    """Every text drawn: not the axis labels and tick labels of an axes turned off (a plot that says
    in words it has nothing), nor a tick label out of view."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks = [label for tick in axis.get_major_ticks() + axis.get_minor_ticks() for label in (tick.label1, tick.label2)]
            drawn = {id(label) for label in _tick_labels(axis)} if ax.axison else set()
            hidden |= {id(t) for t in ticks if id(t) not in drawn}
            if not ax.axison:
                hidden |= {id(axis.label), id(axis.offsetText)}
    return (t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in hidden)
