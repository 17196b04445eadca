"""``parcel-hpc list [ROOT]``: every search under a root, one line each (``ledger.searches`` finds
them, ``accounting.listing`` summarizes each).

Must not write a byte: admins list other people's searches.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from parcel_hpc.accounting.listing import SearchSummary, collect
from parcel_hpc.accounting.spend import ROUNDING_H, shown
from parcel_hpc.config import configured_search_root
from parcel_hpc.console import make_console, safe

READ_ONLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", type=Path, nargs="?", metavar="ROOT", help="where searches live (default: the configured search.root)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    root = args.root if args.root is not None else configured_search_root()
    found = collect(root)
    if args.json:
        print(json.dumps({"root": str(Path(root).absolute()), "searches": [s.to_json() for s in found]}, indent=2))
    else:
        make_console().print(render(found, root))
    return 0


def render(summaries: Sequence[SearchSummary], root: Path, now: float | None = None) -> Table:
    now = time.time() if now is None else now
    table = Table(title=f"{len(summaries)} searches under {safe(root)}")
    for col in (
        "search",
        "owner",
        "trials",
        "by state",
        "GPU-h (held)",
        "CPU-h",
        "cost",
        "charged to the caps: GPU-h, cost",
        "launcher",
        "last activity",
        "best",
    ):
        table.add_column(col)
    for s in summaries:
        if s.problem:
            table.add_row(safe(_rel(s.path, root)), safe(s.owner), "?", f"[red]{safe(s.problem)}[/]", "", "", "", "", "", "", "")
            continue
        spend = s.spend
        assert spend is not None  # a readable search has one
        # The search's one spend (``status`` has its parts); the caps bind what the budget journal
        # charges: the attempts that reserved, and what is still held.
        total = spend.total
        gpu_p, cpu_p = (f" [yellow]{shown(h)} provisional[/]" if h > ROUNDING_H else "" for h in (spend.provisional.gpu_hours, spend.provisional.cpu_hours))
        table.add_row(
            safe(_rel(s.path, root)),
            safe(s.owner),
            str(s.trials),
            " ".join(f"{state}={n}" for state, n in s.counts.items() if n) or "-",
            f"{shown(total.gpu_hours)} ({shown(spend.held.gpu_hours)})" + gpu_p + (f" [yellow]{spend.stale} stale[/]" if spend.stale else ""),
            shown(total.cpu_hours) + cpu_p,
            shown(spend.cost),
            spend.charged_line(s.gpu_hours_cap, s.cost_cap),
            s.launcher.value,
            _ago(s.last_activity, now),
            f"{safe(s.best['trial_id'])} {s.best['miss_cost']:.4f}" if s.best else "-",
        )
    return table


def _rel(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(Path(root).absolute())) or "."
    except ValueError:
        return path


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return "never"
    s = max(0.0, now - t)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"
