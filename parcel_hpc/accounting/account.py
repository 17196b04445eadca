"""Account-wide accounting for admins (pure): every search under a root, or every job charged to a
SLURM account since a date, totalled by user, by search and by partition, with the jobs no search
knows listed.

Input: each search's ``Reconciliation`` (its ledger against the scheduler, ``reconcile.py``) and,
for an account, the scheduler's runs of every job charged to it (``sacct -A NAME --allusers``).
Hours are the scheduler's (AllocTRES x ElapsedRaw); cost is priced at each search's own rates, so
a job no search knows has hours but no cost. No I/O here: ``run.py`` asks sacct and renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from parcel_hpc.accounting.reconcile import AttemptLine, Reconciliation, report_row
from parcel_hpc.accounting.spend import GpuUse
from parcel_hpc.budget import Rates
from parcel_hpc.scheduler.slurm.runs import JobRun

NO_SEARCH = "(no search)"


@dataclass(frozen=True)
class SearchPart:
    """One search's share: its reconciliation, where it lives and who launched it."""

    path: str
    user: str
    reconciliation: Reconciliation


@dataclass(frozen=True)
class Total:
    key: str  # a user, a search's path, or a partition
    jobs: int
    lines: int  # accounting lines: a job run, or one trial's share of a packed run
    gpu_hours: float  # allocated
    cpu_hours: float
    cost: float  # of the runs a search priced
    gpu_use: GpuUse = field(default_factory=GpuUse)  # those GPU-hours used, idle, and without a reading

    def to_json(self) -> dict:
        return report_row(self) | {"gpu_use": self.gpu_use.to_json()}


@dataclass(frozen=True)
class Charge:
    """One run counted once: whose, where, which search (or none), its hours and cost."""

    job_id: str
    user: str
    partition: str
    account: str
    search: str  # a search's path, or NO_SEARCH
    state: str
    start: int | None
    gpu_hours: float
    cpu_hours: float
    cost: float | None  # None: no search prices it
    gpu_hours_used: float | None = None  # gpu_hours x its worker's utilization (None: no reading)
    gpu_hours_idle: float | None = None  # gpu_hours - gpu_hours_used (None: no reading)

    def to_json(self) -> dict:
        return report_row(self)


@dataclass(frozen=True)
class AccountReport:
    scope: str  # "root /shared/runs" or "account parcel since 2026-11-01T00:00:00+00:00"
    searches: tuple[SearchPart, ...]
    charges: tuple[Charge, ...]
    by_user: tuple[Total, ...]
    by_search: tuple[Total, ...]
    by_partition: tuple[Total, ...]
    unknown: tuple[Charge, ...]  # charged to the account, known to no search
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
            "jobs": len({c.job_id for c in self.charges}),
            "lines": len(self.charges),
            "gpu_hours": sum(c.gpu_hours for c in self.charges),
            "cpu_hours": sum(c.cpu_hours for c in self.charges),
            "cost": sum(c.cost or 0.0 for c in self.charges),
            "unknown_gpu_hours": sum(c.gpu_hours for c in self.unknown),
            "gpu_use": gpu_use(self.charges).to_json(),
        }

    def to_json(self) -> dict:
        return {
            "scope": self.scope,
            "complete": self.complete,
            "totals": self.totals(),
            "by_user": [t.to_json() for t in self.by_user],
            "by_search": [t.to_json() for t in self.by_search],
            "by_partition": [t.to_json() for t in self.by_partition],
            "unknown_jobs": [c.to_json() for c in self.unknown],
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
            "charges": [c.to_json() for c in self.charges],
            "unreadable": [{"path": path, "problem": problem} for path, problem in self.unreadable],
        }


def over_searches(scope: str, parts: Sequence[SearchPart]) -> AccountReport:
    """Every run each search's reconciliation counted (its ledger's jobs and the orphans under its name)."""
    charges = [_charge(line, part) for part in parts for line in _lines(part.reconciliation) if line.elapsed_s or line.start is not None]
    return _report(scope, parts, charges, ())


def over_account(
    scope: str,
    parts: Sequence[SearchPart],
    account_runs: Sequence[JobRun],
    rates: Mapping[str, Rates],
    other_jobs: Mapping[str, Iterable[str]] | None = None,
) -> AccountReport:
    """Every run charged to the account, by the scheduler; a run a search knows is that search's,
    priced at its rates (``rates``: search path -> Rates); the others are listed as unknown.
    ``other_jobs``: search path -> job ids it submitted outside its trials (its selection's)."""
    owner: dict[str, str] = {}
    for part in parts:
        for job in part.reconciliation.lines().column("job_id").to_pylist():
            owner.setdefault(job, part.path)
    for path, jobs in (other_jobs or {}).items():
        for job in jobs:
            owner.setdefault(job, path)
    charges, unknown = [], []
    for run in account_runs:
        search = owner.get(run.job_id, NO_SEARCH)
        cost = rates[search].cost(run.gpu_hours, run.cpu_hours) if search in rates else None
        charge = Charge(run.job_id, run.user, run.partition, run.account, search, run.state.text, run.start, run.gpu_hours, run.cpu_hours, cost)
        charges.append(charge)
        if search == NO_SEARCH:
            unknown.append(charge)
    involved = {c.search for c in charges}
    return _report(scope, [p for p in parts if p.path in involved], charges, unknown)


def _lines(rec: Reconciliation) -> Iterator[AttemptLine]:
    for batch in rec.lines().to_batches():
        yield from (AttemptLine(**row) for row in batch.to_pylist())


def _charge(line: AttemptLine, part: SearchPart) -> Charge:
    return Charge(
        line.job_id,
        line.user or part.user,
        line.partition,
        "",
        part.path,
        line.state,
        line.start,
        line.gpu_hours,
        line.cpu_hours,
        line.cost,
        line.gpu_hours_used,
        line.gpu_hours_idle,
    )


def _report(scope: str, parts: Sequence[SearchPart], charges: Sequence[Charge], unknown: Sequence[Charge]) -> AccountReport:
    return AccountReport(
        scope,
        tuple(parts),
        tuple(charges),
        _totals(charges, lambda c: c.user or "?"),
        _totals(charges, lambda c: c.search),
        _totals(charges, lambda c: c.partition or "?"),
        tuple(unknown),
    )


def gpu_use(charges: Iterable[Charge]) -> GpuUse:
    """The charges' GPU-hours used, idle and without a reading (a job no search knows has none)."""
    return sum((GpuUse.of_line(c.gpu_hours, c.gpu_hours_used) for c in charges), GpuUse())


def _totals(charges: Sequence[Charge], key) -> tuple[Total, ...]:
    groups: dict[str, list[Charge]] = {}
    for c in charges:
        groups.setdefault(key(c), []).append(c)
    totals = [
        Total(
            k,
            len({c.job_id for c in cs}),
            len(cs),
            sum(c.gpu_hours for c in cs),
            sum(c.cpu_hours for c in cs),
            sum(c.cost or 0.0 for c in cs),
            gpu_use(cs),
        )
        for k, cs in groups.items()
    ]
    return tuple(sorted(totals, key=lambda t: (-t.gpu_hours, -t.cpu_hours, t.key)))
