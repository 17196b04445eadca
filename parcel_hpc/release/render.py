"""The release packet as Markdown and as one self-contained HTML page with plots (jinja2 + matplotlib).

Pure formatting of the packet's JSON value: nothing here reads the search directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import jinja2

from parcel_hpc.documents import markdown_text
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.plotting import png_of, pyplot


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) >= 10 ** (-digits) or value == 0 else f"{value:.2e}"
    return str(value)


def _when(t: float | None) -> str:
    return "–" if t is None else time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


# The page is HTML-escaped and the Markdown escaped as Markdown (documents.markdown_text, every
# value): a reviewer's reason or a parameter can never inject markup or a link into either.
def _environment(**options: Any) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("parcel_hpc.release", "templates"), undefined=jinja2.StrictUndefined, **options)
    env.filters.update(fmt=_fmt, when=_when)
    return env


_ENV = _environment(autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False, default=False))
_MD_ENV = _environment(finalize=markdown_text)


def slice_table(packet: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Validation (and final, once evaluated) rows of winner and baseline side by side."""
    slices = packet.get("slices")
    if not slices:
        return []
    base = {(r["column"], r["value"]): r for r in slices["baseline"]}
    failed = {(f["column"], f["value"]) for f in slices["gate"] if not f["passed"]}
    final = packet.get("final") or {}
    fw = {(r["column"], r["value"]): r for r in final.get("winner", {}).get("slices", [])}
    rows = []
    for w in slices["winner"]:
        key = (w["column"], w["value"])
        b = base.get(key, {})
        rows.append(
            {
                "slice": f"{w['column']}={w['value']}",
                "n": w["n"],
                "positives": w["positives"],
                "winner_recall": w["recall"],
                "baseline_recall": b.get("recall"),
                "winner_cost": w["miss_cost"],
                "baseline_cost": b.get("miss_cost"),
                "final_recall": fw.get(key, {}).get("recall"),
                "final_cost": fw.get(key, {}).get("miss_cost"),
                "failed": key in failed,
            }
        )
    return rows


def to_markdown(packet: Mapping[str, Any]) -> str:
    return _MD_ENV.get_template("packet.md.j2").render(p=packet, registered=_registered(packet), rows=slice_table(packet), plots={})


def to_html(packet: Mapping[str, Any], history: Mapping[str, Any] | None = None) -> str:
    return _ENV.get_template("packet.html.j2").render(p=packet, registered=_registered(packet), rows=slice_table(packet), plots=_plots(packet, history or {}))


def _registered(packet: Mapping[str, Any]) -> bool:
    return Outcome.parse(packet["outcome"]) == Outcome.RELEASE_REGISTERED


def _plots(packet: Mapping[str, Any], history: Mapping[str, Any]) -> dict[str, str]:
    plt = pyplot()
    out = {}

    counts = packet["counts"]
    fig, ax = plt.subplots(figsize=(6.4, 2.6))
    names = list(counts)
    ax.barh(names, [counts[n] for n in names], color="#4c78a8")
    ax.invert_yaxis()
    ax.set_xlabel("trials")
    ax.set_title("trials by final state")
    out["counts"] = png_of(fig)

    rows = [r for r in slice_table(packet) if r["winner_recall"] is not None and r["slice"] != "overall=all"]
    if rows:
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        x = range(len(rows))
        ax.bar(
            [i - 0.2 for i in x], [r["winner_recall"] for r in rows], width=0.4, label="selected", color=["#d62728" if r["failed"] else "#4c78a8" for r in rows]
        )
        ax.bar([i + 0.2 for i in x], [r["baseline_recall"] or 0 for r in rows], width=0.4, label="baseline", color="#bbbbbb")
        ax.set_xticks(list(x), [r["slice"].split("=", 1)[1] for r in rows], rotation=45, ha="right")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("recall (validation)")
        ax.set_title("recall by slice: selected vs baseline (red: failed the gate)")
        ax.legend(loc="lower right")
        out["slices"] = png_of(fig)

    curves = history.get("curves") or {}
    if curves:
        fig, ax = plt.subplots(figsize=(7.5, 3.2))
        winner = packet["selection"]["trial_id"]
        for tid, points in curves.items():
            steps, values = zip(*points)
            ax.plot(steps, values, color="#d62728" if tid == winner else "#cccccc", linewidth=2 if tid == winner else 0.8, zorder=3 if tid == winner else 1)
        base = ((packet.get("lineage") or {}).get("what_was_concluded") or {}).get("baseline", {}).get("validation_metric")
        if base is not None:
            ax.axhline(base, color="#555555", linestyle="--", label="baseline")
            ax.legend(loc="upper right")
        ax.set_xlabel("step")
        ax.set_ylabel("validation miss-cost")
        ax.set_title(f"every trial's milestones; {winner} in red")
        out["curves"] = png_of(fig)
    return out
