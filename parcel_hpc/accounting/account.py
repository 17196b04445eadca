"""Account-wide accounting for admins (pure): every search under a root, or every job charged to a
SLURM account since a date, totalled by user, by search, by partition and by account, with the
jobs no search knows listed.

Input: each search's ``Reconciliation`` (its ledger against the scheduler, ``reconcile.py``) and,
for an account, the scheduler's runs of every job charged to it (``sacct -A NAME --allusers``), as
columns. Hours are the scheduler's (AllocTRES x ElapsedRaw); cost is priced at each search's own
rates, so a job no search knows has hours but no cost. Every run is a row of one table
(``CHARGE_SCHEMA``) from the parse to the printed report: a month of an account's jobs is joined to
its searches, priced and totalled by Arrow, never a Python object per run. No I/O here:
``account_report.py`` asks sacct and renders.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parcel_hpc.accounting import columns
from parcel_hpc.accounting.reconcile import Reconciliation, report_row
from parcel_hpc.accounting.spend import GpuUse
from parcel_hpc.budget import Rates
from parcel_hpc.scheduler.run_table import runs_table
from parcel_hpc.scheduler.runs import JobRun

NO_SEARCH = "(no search)"
NO_KEY = "?"  # a total's key when sacct left the field empty
# One run counted once: whose, where, which search (or NO_SEARCH), its hours and cost (null: no
# search prices it), and its GPU-hours used and idle by its worker's reading (null: no reading).
CHARGE_SCHEMA = pa.schema(
    [
        ("job_id", pa.string()),
        ("user", pa.string()),
        ("partition", pa.string()),
        ("account", pa.string()),
        ("search", pa.string()),
        ("state", pa.string()),
        ("start", pa.int64()),
        ("gpu_hours", pa.float64()),
        ("cpu_hours", pa.float64()),
        ("cost", pa.float64()),
        ("gpu_hours_used", pa.float64()),
        ("gpu_hours_idle", pa.float64()),
    ]
)


@dataclass(frozen=True)
class SearchPart:
    """One search's share: its reconciliation, where it lives and who launched it."""

    path: str
    user: str
    reconciliation: Reconciliation


@dataclass(frozen=True)
class Total:
    key: str  # a user, a search's path, a partition or an account
    jobs: int
    lines: int  # accounting lines: a job run, or one trial's share of a packed run
    gpu_hours: float  # allocated
    cpu_hours: float
    cost: float  # of the runs a search priced
    gpu_use: GpuUse = field(default_factory=GpuUse)  # those GPU-hours used, idle, and without a reading

    def to_json(self) -> dict:
        return report_row(self) | {"gpu_use": self.gpu_use.to_json()}


@dataclass(frozen=True)
class AccountReport:
    scope: str  # "root /shared/runs" or "account parcel since 2026-11-01T00:00:00+00:00"
    searches: tuple[SearchPart, ...]
    charges: pa.Table  # CHARGE_SCHEMA: every run, once
    by_user: tuple[Total, ...]
    by_search: tuple[Total, ...]
    by_partition: tuple[Total, ...]
    by_account: tuple[Total, ...]
    unknown: pa.Table  # CHARGE_SCHEMA: the runs charged to the account that no search knows
    unreadable: tuple[tuple[str, str], ...] = ()  # (path, problem) of each search under the root that did not read

    @property
    def pending(self) -> int:
        """How many jobs sacct has not filed in full yet, over every search."""
        return sum(len(p.reconciliation.pending) for p in self.searches)

    @property
    def complete(self) -> bool:
        return not self.pending

    @property
    def flags(self) -> int:
        return sum(p.reconciliation.flag_count for p in self.searches)

    def totals(self) -> dict:
        return {
            "jobs": pc.count_distinct(self.charges.column("job_id")).as_py(),
            "lines": self.charges.num_rows,
            **columns.totals(self.charges),
            "unknown_gpu_hours": columns.totals(self.unknown)["gpu_hours"],
            "gpu_use": gpu_use(self.charges).to_json(),
        }

    def json_chunks(self) -> Iterator[columns.Text]:
        """The report as one JSON object, the runs written a slice at a time."""
        head = {
            "scope": self.scope,
            "complete": self.complete,
            "totals": self.totals(),
            "by_user": [t.to_json() for t in self.by_user],
            "by_search": [t.to_json() for t in self.by_search],
            "by_partition": [t.to_json() for t in self.by_partition],
            "by_account": [t.to_json() for t in self.by_account],
            "searches": [
                {
                    "path": p.path,
                    "user": p.user,
                    "campaign": p.reconciliation.campaign,
                    "complete": p.reconciliation.complete,
                    "flags": p.reconciliation.flag_count,
                    "spend": p.reconciliation.spend.to_json(),
                    "scheduler": {k: dict(v) for k, v in p.reconciliation.scheduler.items()},
                    "figures": dict(p.reconciliation.figures),
                }
                for p in self.searches
            ],
            "unreadable": [{"path": path, "problem": problem} for path, problem in self.unreadable],
        }
        yield json.dumps(head)[:-1].encode() + b',"unknown_jobs":'
        yield from columns.json_array(columns.json_items(self.unknown))
        yield b',"charges":'
        yield from columns.json_array(columns.json_items(self.charges))
        yield b"}"


def over_searches(scope: str, parts: Sequence[SearchPart]) -> AccountReport:
    """Every run each search's reconciliation counted (its ledger's jobs and the orphans under its name)."""
    charges = pa.concat_tables([CHARGE_SCHEMA.empty_table(), *(_charges_of(part) for part in parts)])
    return _report(scope, parts, charges, CHARGE_SCHEMA.empty_table())


def over_account(
    scope: str,
    parts: Sequence[SearchPart],
    account_runs: pa.Table | Sequence[JobRun],
    rates: Mapping[str, Rates],
    other_jobs: Mapping[str, Iterable[str]] | None = None,
) -> AccountReport:
    """Every run charged to the account (``runs.run_table`` columns, or records), by the scheduler;
    a run a search knows is that search's, priced at its rates (``rates``: search path -> Rates);
    the others are listed as unknown. ``other_jobs``: search path -> job ids it submitted outside
    its trials (its selection's). A job two searches name is the first's."""
    runs = account_runs if isinstance(account_runs, pa.Table) else runs_table(account_runs)
    paths = [p.path for p in parts] + list(other_jobs or {})
    named = [p.reconciliation.lines().column("job_id").combine_chunks() for p in parts] + [pa.array(list(j), pa.string()) for j in (other_jobs or {}).values()]
    owner_of = np.repeat(np.arange(len(paths)), [len(n) for n in named])
    found = pc.index_in(runs.column("job_id"), value_set=pa.concat_arrays([pa.array([], pa.string()), *named]))  # the first match: the first search
    known = pc.is_valid(found).to_numpy(zero_copy_only=False)
    owner = np.where(known, owner_of[pc.fill_null(found, 0).to_numpy()] if len(owner_of) else 0, len(paths))
    search = pa.array([*paths, NO_SEARCH], pa.string()).take(pa.array(owner))
    per_gpu = np.array([rates[p].per_gpu_hour if p in rates else np.nan for p in paths] + [np.nan])[owner]
    per_cpu = np.array([rates[p].per_cpu_hour if p in rates else np.nan for p in paths] + [np.nan])[owner]
    cost = runs.column("gpu_hours").to_numpy() * per_gpu + runs.column("cpu_hours").to_numpy() * per_cpu
    none = pa.nulls(runs.num_rows, pa.float64())
    charges = _charges(runs, runs.column("user"), runs.column("account"), search, runs.column("state_text"), pa.array(cost, mask=np.isnan(cost)), none, none)
    unknown = charges.filter(pa.array(~known))
    involved = set(pc.unique(search).to_pylist())
    return _report(scope, [p for p in parts if p.path in involved], charges, unknown)


def _charges_of(part: SearchPart) -> pa.Table:
    lines = part.reconciliation.lines()
    lines = lines.filter(pc.or_(pc.not_equal(lines.column("elapsed_s"), 0), pc.is_valid(lines.column("start"))))
    user = lines.column("user")
    user = pc.if_else(pc.equal(user, ""), part.user, user)  # a local run: the search's launcher is its user
    search = pa.repeat(part.path, lines.num_rows)
    return _charges(
        lines,
        user,
        lines.column("account"),
        search,
        lines.column("state"),
        lines.column("cost"),
        lines.column("gpu_hours_used"),
        lines.column("gpu_hours_idle"),
    )


def _charges(rows: pa.Table, user, account, search, state, cost, used, idle) -> pa.Table:
    parts = {"user": user, "account": account, "search": search, "state": state, "cost": cost, "gpu_hours_used": used, "gpu_hours_idle": idle}
    return pa.table([pc.cast(parts[f.name] if f.name in parts else rows.column(f.name), f.type) for f in CHARGE_SCHEMA], schema=CHARGE_SCHEMA)


def _report(scope: str, parts: Sequence[SearchPart], charges: pa.Table, unknown: pa.Table) -> AccountReport:
    return AccountReport(
        scope,
        tuple(parts),
        charges,
        _totals(charges, "user"),
        _totals(charges, "search"),
        _totals(charges, "partition"),
        _totals(charges, "account"),
        unknown,
    )


def gpu_use(charges: pa.Table) -> GpuUse:
    """The charges' GPU-hours used, idle and without a reading (a job no search knows has none)."""
    if not charges.num_rows:
        return GpuUse()
    hours, used = charges.column("gpu_hours"), charges.column("gpu_hours_used")
    unread = pc.sum(pc.if_else(pc.is_null(used), hours, 0.0)).as_py()
    return GpuUse(pc.sum(hours).as_py(), pc.sum(pc.fill_null(used, 0.0)).as_py(), unread)


def _totals(charges: pa.Table, key: str) -> tuple[Total, ...]:
    """One Total per value of ``key`` (an empty one as NO_KEY), the most GPU-hours first."""
    keys = charges.column(key)
    hours, used = charges.column("gpu_hours"), charges.column("gpu_hours_used")
    grouped = (
        pa.table(
            {
                "key": pc.if_else(pc.equal(keys, ""), NO_KEY, keys),
                "job_id": charges.column("job_id"),
                "gpu_hours": hours,
                "cpu_hours": charges.column("cpu_hours"),
                "cost": charges.column("cost"),
                "used": pc.fill_null(used, 0.0),
                "unread": pc.if_else(pc.is_null(used), hours, 0.0),
            }
        )
        .group_by("key")
        .aggregate(
            [("job_id", "count_distinct"), ("job_id", "count"), ("gpu_hours", "sum"), ("cpu_hours", "sum"), ("cost", "sum"), ("used", "sum"), ("unread", "sum")]
        )
    )
    totals = [
        Total(
            g["key"],
            g["job_id_count_distinct"],
            g["job_id_count"],
            g["gpu_hours_sum"],
            g["cpu_hours_sum"],
            g["cost_sum"] or 0.0,
            GpuUse(g["gpu_hours_sum"], g["used_sum"], g["unread_sum"]),
        )
        for g in grouped.to_pylist()
    ]
    return tuple(sorted(totals, key=lambda t: (-t.gpu_hours, -t.cpu_hours, t.key)))
