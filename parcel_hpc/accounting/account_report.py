"""``parcel-hpc reconcile --root ROOT`` and ``--account NAME --since DATE``: the admin's report over
many searches, and its terminal, JSON, CSV and HTML forms.

The edge of ``account.py``: finds the searches, reconciles each (``search_report.reconcile_search``),
asks each scheduler for every run charged to the account (``Backend.account_runs``), and renders. Reads only, like every reconcile.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pyarrow as pa
from rich.table import Table

from parcel_hpc.accounting import columns
from parcel_hpc.accounting.account import CHARGE_SCHEMA, AccountReport, SearchPart, Total, gpu_use, over_account, over_searches
from parcel_hpc.accounting.reconcile import Reconciliation
from parcel_hpc.accounting.search_report import ROWS_SHOWN, reconcile_search
from parcel_hpc.accounting.spend import shown
from parcel_hpc.budget import search_caps
from parcel_hpc.console import safe
from parcel_hpc.errors import AccountingError, SchedulerUnavailable, UsageError
from parcel_hpc.ledger import SearchDir
from parcel_hpc.ledger.searches import UNREADABLE, find_searches, owner_of, problem_of
from parcel_hpc.ledger.selection import JobSubmitted
from parcel_hpc.plotting import hbars, png_of, pyplot, wrapped
from parcel_hpc.scheduler.registry import BACKENDS
from parcel_hpc.scheduler.run_table import runs_table
from parcel_hpc.selection.store import SelectionStore

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("parcel_hpc.accounting", "templates"),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default=True),
    undefined=jinja2.StrictUndefined,
)


def parse_since(text: str) -> _dt.datetime:
    """``--since``: a date or an ISO date and time, UTC unless it says its zone."""
    try:
        moment = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r} is not a date; give YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][+HH:MM]") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=_dt.UTC)


def account_report(root: Path, account: str | None = None, since: _dt.datetime | None = None) -> AccountReport:
    searches, parts, unreadable = [], [], []
    for s in find_searches(root):
        try:
            parts.append(SearchPart(str(s.path), owner_of(s), reconcile_search(s)))
        except (SchedulerUnavailable, AccountingError):
            raise  # the scheduler's fault, not the search's: the report would be wrong for all of them
        except UNREADABLE as exc:  # one damaged or hostile search never hides the others
            unreadable.append((str(s.path), problem_of(exc)))
            continue
        searches.append(s)
    return replace(_over(root, account, since, searches, parts), unreadable=tuple(unreadable))


def _over(root: Path, account: str | None, since: _dt.datetime | None, searches: list[SearchDir], parts: list[SearchPart]) -> AccountReport:
    if account is None:
        return over_searches(f"root {Path(root).absolute()}", parts)
    if since is None:
        raise UsageError("--account needs --since DATE: the report covers the account's jobs from then (sacct would start at today's midnight)")
    runs = pa.concat_tables([runs_table([]), *(b.account_runs(account, since) for b in BACKENDS)])
    # Only searches whose scheduler files its runs can own an account's jobs (a local job id is a pid).
    filed = {b.accounting for b in BACKENDS if b.files_runs}
    charged = [(s, p) for s, p in zip(searches, parts) if p.reconciliation.source in filed]
    rates = {p.path: search_caps(s.contract()).rates for s, p in charged}
    selection_jobs = {p.path: _selection_jobs(s) for s, p in charged}
    return over_account(f"account {account} since {since.isoformat()}", [p for _, p in charged], runs, rates, selection_jobs)


def _selection_jobs(search: SearchDir) -> frozenset[str]:
    """The jobs the search's selection submitted (winner rerun, baseline, final evaluation): the
    search's too, though no trial ran in them."""
    jobs = SelectionStore(search).record().jobs
    return frozenset(e.job_id for events in jobs.values() for e in events if isinstance(e, JobSubmitted))


# --- renderers ---------------------------------------------------------------------------------


def render_table(report: AccountReport, console) -> None:
    t = report.totals()
    console.print(
        f"[bold]{safe(report.scope)}[/]: {len(report.searches)} searches, {t['jobs']} jobs, {t['gpu_hours']:.4f} GPU-h, {t['cpu_hours']:.4f} CPU-h, cost {t['cost']:.4f}"
    )
    gpus = gpu_use(report.charges)
    if gpus.allocated:
        console.print(f"GPUs (the scheduler's hours, the workers' utilization): {gpus.line()}", markup=False, highlight=False)
    for title, rows in (("by user", report.by_user), ("by search", report.by_search), ("by partition", report.by_partition), ("by account", report.by_account)):
        console.print(_totals_table(title, rows))
    searches = Table(title="searches: spend against caps")
    for col in ("search", "user", "GPU-h", "charged to the caps: GPU-h, cost", "flags", "complete"):
        searches.add_column(col)
    for p in report.searches:
        rec = p.reconciliation
        searches.add_row(
            safe(p.path),
            safe(p.user),
            shown(rec.spend.total.gpu_hours),
            charged_line(rec),
            str(rec.flag_count),
            "yes" if rec.complete else "pending",
        )
    console.print(searches)
    if report.unknown.num_rows:
        unknown = Table(title=f"{report.unknown.num_rows} jobs charged to the account that no search knows ({t['unknown_gpu_hours']:.4f} GPU-h)")
        for col in ("job", "user", "partition", "state", "GPU-h", "CPU-h"):
            unknown.add_column(col)
        for c in report.unknown.slice(0, ROWS_SHOWN).to_pylist():
            unknown.add_row(safe(c["job_id"]), safe(c["user"]), safe(c["partition"]), safe(c["state"]), f"{c['gpu_hours']:.4f}", f"{c['cpu_hours']:.4f}")
        if report.unknown.num_rows > ROWS_SHOWN:
            unknown.caption = f"the first {ROWS_SHOWN}; --json or --csv list them all"
        console.print(unknown)
    for path, problem in report.unreadable:
        console.print(f"[red]not read: {safe(path)}: {safe(problem)}[/]")
    if report.flags:
        console.print(f"[yellow]{report.flags} flags in the searches' reconciliations: `parcel-hpc reconcile SEARCH_DIR` shows each[/]")


def charged_line(rec: Reconciliation) -> str:
    """A search's one "charged to the caps" figure, as ``parcel-hpc list`` prints it (``Spend.charged_line``)."""
    return rec.spend.charged_line(rec.scheduler["gpu_hours"]["cap"], rec.scheduler["cost"]["cap"])


def _totals_table(title: str, rows: Sequence[Total]) -> Table:
    table = Table(title=title)
    for col in ("", "jobs", "lines", "GPU-h", "used", "idle", "no reading", "CPU-h", "cost"):
        table.add_column(col)
    for r in rows:
        gpus = (f"{r.gpu_use.used:.4f}", f"{r.gpu_use.idle:.4f}", f"{r.gpu_use.unread:.4f}")
        table.add_row(safe(r.key), str(r.jobs), str(r.lines), f"{r.gpu_hours:.4f}", *gpus, f"{r.cpu_hours:.4f}", f"{r.cost:.4f}")
    return table


def csv_chunks(report: AccountReport) -> Iterator[bytes]:
    """One CSV row per job run, with the search it belongs to (or none), a slice at a time."""
    yield (",".join(CHARGE_SCHEMA.names) + "\n").encode()
    yield from columns.csv_text(report.charges)


def to_html(report: AccountReport) -> str:
    """One self-contained page (plots inlined as PNG data URIs: it opens with no network)."""
    return _ENV.get_template("account.html.j2").render(
        report=report,
        charged=charged_line,
        totals=report.totals(),
        plots=[(title, png_of(fig)) for title, fig in figures(report)],
        unknown=report.unknown.slice(0, ROWS_SHOWN).to_pylist(),
        generated=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    )


def figures(report: AccountReport) -> list[tuple[str, Any]]:
    """The page's figures, by title (tests check each one's text stays inside it)."""
    plt = pyplot()
    out = []
    for title, rows in (("GPU-hours by user", report.by_user), ("GPU-hours by search", report.by_search), ("GPU-hours by partition", report.by_partition)):
        fig, ax = plt.subplots(figsize=(7, 1.2 + 0.4 * max(1, len(rows))))  # the title and tick labels, then a bar each
        labels = [_short(r.key) for r in rows]
        values = [r.gpu_hours for r in rows]
        hbars(ax, labels, values, [f"{v:.4g} GPU-h" for v in values])
        ax.set_title(title)
        out.append((title, fig))
    fig, ax = plt.subplots(figsize=(7, 1.8 + 0.5 * max(1, len(report.searches))))  # and a wrapped axis label
    charged = [(p.reconciliation.spend.charged.gpu_hours, p.reconciliation.scheduler["gpu_hours"]["cap"]) for p in report.searches]
    used = [100 * c / cap if cap else 0.0 for c, cap in charged]
    texts = [f"{shown(c)} of {cap:g} GPU-h charged ({u:.3g} %)" for (c, cap), u in zip(charged, used)]
    hbars(ax, [_short(p.path) for p in report.searches], used, texts)
    ax.set_xlabel(wrapped("% of the search's GPU-hour cap charged (axis fitted to the largest: small shares stay visible)", fig))
    ax.set_title("spend against each search's cap")
    out.append(("spend against caps", fig))
    return out


def _short(path: str, room: int = 40) -> str:
    return path if len(path) <= room else "…" + path[-(room - 1) :]
