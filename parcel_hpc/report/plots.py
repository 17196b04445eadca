"""The search report's figures (matplotlib on Agg), one per section of the page, readable at 3
trials and at 10,000: lines and points thin out and fade as trials add up, long labels are cut
short, and a figure with nothing to show says so in words.

Draws ``data``'s values; must not read files or decide what a value is. ``page.py`` encodes the
figures; tests lay them out and check every text inside the figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parcel_hpc.ledger import Cause, TrialState
from parcel_hpc.plotting import hbars, nothing_to_show, pyplot
from parcel_hpc.propose.space import CHOICE
from parcel_hpc.report.data import SearchFacts, cause_counts, history, state_counts
from parcel_hpc.report.importance import Importance

METRIC = "validation miss-cost"
STATE_COLORS = {
    TrialState.COMPLETED: "#4477aa",
    TrialState.PRUNED: "#aaaaaa",
    TrialState.RUNNING: "#ee7733",
    TrialState.QUEUED: "#ccbb44",
}
OTHER_COLOR = "#cc3311"  # failed, quarantined, refused, cancelled
PRUNED_MARK = "#cc3311"
LEVELS_SHOWN = 8  # a categorical axis names at most this many of its levels
LOG_SPREAD = 100.0  # a histogram's x is logarithmic when its largest value is this many times its smallest
NAME_CHARS = 18  # a parameter's name on an axis


def figures(facts: SearchFacts, importance: Importance) -> dict[str, Any]:
    """Every figure of the page, by section; the importance only where it was computed."""
    out = {
        "history": history_figure(facts),
        "curves": curves_figure(facts),
        "parallel": parallel_figure(facts),
        "states": states_figure(facts),
        "durations": durations_figure(facts),
    }
    if importance.shares:
        out["importance"] = importance_figure(importance)
    return out


def alpha(n: int) -> float:
    """Opacity of one of ``n`` overlapping lines or points: solid for a few, faint for thousands,
    so where many overlap reads darker (a density) instead of one solid block."""
    return min(0.9, max(0.04, 8.0 / math.sqrt(max(n, 1))))


def width(n: int) -> float:
    """Line width (points) of one of ``n`` lines."""
    return min(1.5, max(0.3, 1.5 * (50.0 / max(n, 1)) ** 0.25))


def history_figure(facts: SearchFacts) -> Any:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator  # matplotlib: imported with pyplot, on first plot

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    points = history(facts)
    scored = [p for p in points if p.metric is not None]
    if not scored:
        for ax in axes:
            nothing_to_show(ax, "no trial has completed yet: no metric to plot")
        return fig
    gpu = facts.uses_gpus
    hours = [p.spent.gpu_hours if gpu else p.spent.cpu_hours for p in points]
    unit = "GPU-hours spent" if gpu else "CPU-hours spent (the search used no GPUs)"
    for ax, xs, label in ((axes[0], [p.n for p in points], "trials finished"), (axes[1], hours, unit)):
        where = {p.trial_id: x for p, x in zip(points, xs)}
        ax.scatter(
            [where[p.trial_id] for p in scored],
            [p.metric for p in scored],
            s=max(2.0, 20.0 * alpha(len(scored))),
            color="#4477aa",
            alpha=alpha(len(scored)),
            linewidths=0,
            label="a completed trial",
        )
        best = [(x, p.best) for p, x in zip(points, xs) if p.best is not None]
        ax.step([x for x, _ in best], [b for _, b in best], where="post", color="#cc3311", linewidth=1.5, label="best so far")
        ax.set_xlabel(label)
        ax.set_ylabel(f"{METRIC} (lower is better)")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=ax is axes[0]))  # a trial count has no halves
        ax.set_xlim(0, max(xs) * 1.04 or 1.0)  # from the start, however few trials have finished
    axes[0].set_title("best so far, in the order trials finished")
    axes[1].set_title("best so far, against what was spent")
    for handle in axes[0].legend(loc="upper right", fontsize=8).legend_handles:
        handle.set_alpha(1.0)  # the key stays legible where thousands of points are faint
    return fig


def curves_figure(facts: SearchFacts) -> Any:
    plt = pyplot()
    from matplotlib.collections import LineCollection  # matplotlib: imported with pyplot, on first plot
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(10, 4.2))
    drawn = [t for t in facts.trials if t.curve]
    if not drawn:
        nothing_to_show(ax, "no trial has reported a milestone yet")
        return fig
    n = len(drawn)
    lines = LineCollection(
        [np.asarray(t.curve, dtype=float) for t in drawn],
        colors=[STATE_COLORS.get(t.state, OTHER_COLOR) for t in drawn],
        linewidths=width(n),
        alpha=alpha(n),
    )
    ax.add_collection(lines)
    lone = [t for t in drawn if len(t.curve) == 1]  # one point is no line: a search with one milestone still shows its values
    if lone:
        ax.scatter(
            [t.curve[0][0] for t in lone],
            [t.curve[0][1] for t in lone],
            color=[STATE_COLORS.get(t.state, OTHER_COLOR) for t in lone],
            s=max(4.0, 20.0 * alpha(len(lone))),
            alpha=alpha(len(lone)),
            zorder=2,
        )
    pruned = [t.pruned_at for t in drawn if t.pruned_at is not None]
    if pruned:
        ax.scatter(
            [s for s, _ in pruned],
            [v for _, v in pruned],
            marker="x",
            color=PRUNED_MARK,
            s=max(6.0, 30.0 * alpha(len(pruned))),
            alpha=min(1.0, 2 * alpha(len(pruned))),
            linewidths=1.0,
            zorder=3,
        )
    ax.autoscale_view()
    present = [s for s in TrialState if any(t.state is s for t in drawn)]
    handles = [Line2D([], [], color=STATE_COLORS.get(s, OTHER_COLOR), label=s.value) for s in present]
    if pruned:
        handles.append(Line2D([], [], color=PRUNED_MARK, marker="x", linestyle="", label="pruned at this milestone"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{METRIC} (lower is better)")
    ax.set_title(f"every trial's milestones ({n} trials)")
    return fig


def parallel_figure(facts: SearchFacts) -> Any:
    """One vertical axis for the metric and one per parameter, each scaled to 0..1 (a log-scaled
    parameter on its logarithm; a categorical one's levels evenly spaced), a line per completed
    trial coloured by its metric."""
    plt = pyplot()
    from matplotlib.collections import LineCollection

    names = sorted(facts.space)
    fig, ax = plt.subplots(figsize=(min(13.0, 2.5 + 1.7 * (len(names) + 1)), 4.2))
    done = facts.completed
    if not done:
        nothing_to_show(ax, "no trial has completed yet: the parallel coordinates colour trials by their metric")
        return fig
    metrics = np.array([t.metric for t in done], dtype=float)
    low, high = float(metrics.min()), float(metrics.max())
    columns = [_unit(metrics, low, high)] + [np.array([_position(facts.space[p], t.params.get(p)) for t in done]) for p in names]
    ys = np.column_stack(columns)
    xs = np.arange(len(columns), dtype=float)
    cmap = plt.get_cmap("viridis_r")
    order = np.argsort(-metrics)  # the best drawn last, on top
    lines = LineCollection([np.column_stack([xs, ys[i]]) for i in order], linewidths=width(len(done)), alpha=alpha(len(done)), cmap=cmap)
    lines.set_array(metrics[order])
    pad = 0.02 * (high - low) if high > low else max(abs(low) * 0.01, 1e-6)  # one metric alone: a scale around it
    lines.set_clim(low - pad, high + pad)
    ax.add_collection(lines)
    for x in xs:
        ax.axvline(x, color="#555555", linewidth=0.8)
    _axis_marks(ax, 0, [(0.0, f"{low:.4g}"), (1.0, f"{high:.4g}")])
    for i, p in enumerate(names, 1):
        _axis_marks(ax, i, _marks(facts.space[p]))
    labels = [f"{METRIC}"] + [_short(p) + (" (log)" if facts.space[p].get("log") else "") for p in names]
    ax.set_xticks(xs, labels, rotation=20, ha="right", fontsize=9)
    ax.set_yticks([])
    ax.set_xlim(-0.1, len(columns) - 0.5)
    ax.set_ylim(-0.05, 1.05)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    bar = fig.colorbar(lines, ax=ax, pad=0.02)
    bar.set_label(f"{METRIC} (lower is better)")
    bar.solids.set_alpha(1.0)
    ax.set_title(f"parameters of the {len(done)} completed trial{'s' if len(done) > 1 else ''}, coloured by {METRIC}")
    return fig


def _unit(values: np.ndarray, low: float, high: float) -> np.ndarray:
    return (values - low) / (high - low) if high > low else np.full(values.shape, 0.5)


def _position(spec: Mapping[str, Any], value: Any) -> float:
    """Where ``value`` sits on its parameter's axis, 0..1 (NaN: not in the space, not drawn)."""
    if spec["type"] == CHOICE:
        levels = list(spec["values"])
        if value not in levels:
            return math.nan
        return levels.index(value) / (len(levels) - 1) if len(levels) > 1 else 0.5
    low, high, v = float(spec["low"]), float(spec["high"]), float(value)
    if spec.get("log"):
        low, high, v = math.log(low), math.log(high), math.log(v)
    return (v - low) / (high - low) if high > low else 0.5


def _marks(spec: Mapping[str, Any]) -> list[tuple[float, str]]:
    """The labelled positions of a parameter's axis: its levels (every k-th of many), or its bounds."""
    if spec["type"] == CHOICE:
        levels = list(spec["values"])
        every = math.ceil(len(levels) / LEVELS_SHOWN)
        return [(_position(spec, v), _short(str(v), 10)) for v in levels[::every]]
    return [(0.0, f"{spec['low']:.3g}"), (1.0, f"{spec['high']:.3g}")]


def _axis_marks(ax: Any, x: float, marks: Sequence[tuple[float, str]]) -> None:
    for y, text in marks:
        ax.annotate(text, (x, y), xytext=(3, 0), textcoords="offset points", fontsize=7, va="center", color="#222222")


def importance_figure(importance: Importance) -> Any:
    plt = pyplot()
    shares = importance.shares
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * len(shares)))
    hbars(ax, [_short(p) for p in shares], list(shares.values()), [f"{v:.3g}" for v in shares.values()])
    ax.set_xlabel(f"share of the {METRIC}'s variance (Optuna's fANOVA)")
    ax.set_title("parameter importance")
    return fig


def states_figure(facts: SearchFacts) -> Any:
    plt = pyplot()
    states, causes = state_counts(facts), cause_counts(facts)
    rows = max(len(states), len(causes), 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.4 + 0.32 * rows))
    hbars(axes[0], [s.value for s in states], list(states.values()), [str(n) for n in states.values()], [STATE_COLORS.get(s, OTHER_COLOR) for s in states])
    axes[0].set_title("trials by state")
    axes[0].set_xlabel("trials")
    if causes:
        hbars(axes[1], [c.value for c in causes], list(causes.values()), [str(n) for n in causes.values()], [_cause_color(c) for c in causes])
        axes[1].set_xlabel("attempts")
    else:
        nothing_to_show(axes[1], "no attempt failed or was interrupted")
    axes[1].set_title("attempts by cause")
    return fig


def _cause_color(cause: Cause) -> str:
    if cause.is_training_failure():
        return "#cc3311"
    return "#ee7733" if cause.is_infrastructure() else "#777777"


def durations_figure(facts: SearchFacts) -> Any:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    waits = [a.queue_wait_s for a in facts.attempts if a.queue_wait_s is not None]
    durations = [a.duration_s for a in facts.attempts if a.duration_s is not None]
    _histogram(axes[0], waits, "queue wait (s): submission to start", "no attempt has started yet")
    _histogram(axes[1], durations, "attempt duration (s): start to end", "no attempt has ended yet")
    return fig


def _histogram(ax: Any, values: Sequence[float], label: str, empty: str) -> None:
    if not values:
        nothing_to_show(ax, empty)
        return
    positive = [v for v in values if v > 0]
    bins = int(min(40, max(5, math.sqrt(len(values)))))
    log = len(positive) >= 2 and max(positive) > LOG_SPREAD * min(positive)
    if log:
        ax.hist(positive, bins=np.geomspace(min(positive), max(positive), bins + 1), color="#4477aa")
        ax.set_xscale("log")
    else:
        ax.hist(values, bins=bins, color="#4477aa")
    hidden = len(values) - len(positive) if log else 0
    ax.set_xlabel(label + (f"; {hidden} of 0 s or less not on this log axis" if hidden else ""))
    ax.set_ylabel("attempts")
    ax.set_title(f"{len(values)} attempts")


def _short(text: str, room: int = NAME_CHARS) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"
