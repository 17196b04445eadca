"""A search's spend: one figure, one breakdown, what every read command and the packet print.

``search_spend`` (pure) counts each hour once, from the ledger and the budget journal:

- attempts: the trials' own attempts. One the journal holds counts what it settled; one that never
  reserved (refused at admission, budget_exhausted) its start to end by ``budget.attempt_usage``,
  the rule settling uses;
- start-up and gaps: what a job held no attempt of which ran: from its worker process's start to
  its first trial (interpreter, imports, unpickling; the ``started`` event records when the process
  began) and, in a pack, between one trial's end and the next one's start, per run of the job, at
  its resources. Before the process (the batch script, srun) only sacct sees: ``reconcile``;
- selection jobs: the winner's rerun with the baseline, and the final evaluation, each its own
  start to end times the resources it held;
- held: the worst case still reserved for attempts that have not settled (running ones, and holds
  an ended attempt left: ``reconcile`` flags those, ``sync`` settles them).

``total = attempts + start-up and gaps + selection jobs + held``; cost is priced at the search's
rates (``budget.rate_per_gpu_hour``, ``rate_per_cpu_hour``). The budget's caps bind ``charged``:
the journal's used + held (the attempts that reserved, and what is held); start-up and gaps,
selection jobs and attempts that never reserved are spent but were never reserved. sacct's figure
(``reconcile``) is the scheduler's account of the same jobs, a reconciliation against this one,
never a second spend.

``read_spend`` is the read edge; it never writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from parcel_hpc.budget import BudgetLedger, Hold, JournalView, Rates, ReservationKey, attempt_usage, hours_between, search_caps
from parcel_hpc.ledger import Attempt, DeviceUse, JobRole, SearchDir, TrialRecord
from parcel_hpc.lifecycle.settlement import stale_holds
from parcel_hpc.selection.store import SelectionStore

DECIMALS = 4  # every printed figure: hours and cost, the same rounding everywhere
JSON_DECIMALS = 6  # micro-hours: the journal's own resolution


def shown(figure: float) -> str:
    """A printed figure, rounded from the JSON's own: rounding the raw figure straight to ``DECIMALS``
    could print 0.0000 where the JSON's 0.000050 reads 0.0001."""
    return f"{round(figure, JSON_DECIMALS):.{DECIMALS}f}"


@dataclass(frozen=True)
class Hours:
    gpu_hours: float = 0.0
    cpu_hours: float = 0.0

    def __add__(self, other: Hours) -> Hours:
        return Hours(self.gpu_hours + other.gpu_hours, self.cpu_hours + other.cpu_hours)

    def cost(self, rates: Rates) -> float:
        return rates.cost(self.gpu_hours, self.cpu_hours)

    def to_json(self, rates: Rates) -> dict[str, float]:
        return {
            "gpu_hours": round(self.gpu_hours, JSON_DECIMALS),
            "cpu_hours": round(self.cpu_hours, JSON_DECIMALS),
            "cost": round(self.cost(rates), JSON_DECIMALS),
        }


@dataclass(frozen=True)
class GpuUse:
    """The attempts' GPU-hours in jobstats' words: allocated (each attempt's hours times the GPUs it
    was granted, the spend's own figure), used (allocated times the mean utilization its worker
    read), idle (the rest). ``unread``: allocated hours with no utilization reading, neither used
    nor idle."""

    allocated: float = 0.0
    used: float = 0.0
    unread: float = 0.0

    @property
    def idle(self) -> float:
        return self.allocated - self.used - self.unread

    def __add__(self, other: GpuUse) -> GpuUse:
        return GpuUse(self.allocated + other.allocated, self.used + other.used, self.unread + other.unread)

    @classmethod
    def of(cls, gpu_hours: float, use: DeviceUse | None) -> GpuUse:
        """One attempt's (pure)."""
        if gpu_hours <= 0:
            return cls()
        if use is None or use.utilization is None:
            return cls(gpu_hours, 0.0, gpu_hours)
        return cls(gpu_hours, gpu_hours * use.utilization)

    @classmethod
    def of_line(cls, gpu_hours: float, used: float | None) -> GpuUse:
        """A report line's, from its ``columns`` (used None: the line had no reading)."""
        return cls(gpu_hours, used or 0.0, gpu_hours if used is None else 0.0)

    def columns(self) -> tuple[float | None, float | None]:
        """(used, idle) for a line's columns: None where an hour had no reading (unknown, never 0)."""
        return (None, None) if self.unread else (self.used, self.idle)

    def line(self) -> str:
        unread = f", {shown(self.unread)} without a utilization reading" if self.unread else ""
        return f"allocated {shown(self.allocated)} GPU-h: used {shown(self.used)}, idle {shown(self.idle)}{unread}"

    def to_json(self) -> dict[str, float]:
        return {k: round(v, JSON_DECIMALS) for k, v in (("allocated", self.allocated), ("used", self.used), ("idle", self.idle), ("unread", self.unread))}


@dataclass(frozen=True)
class Spend:
    """What a search spent and still holds. The parts add up to the total, by construction."""

    attempts: Hours  # the trials' own attempts, settled or never reserved
    overhead: Hours  # jobs' start-up before their first trial, and a pack's gaps between its trials
    selection: Hours  # the selection's rerun and final-evaluation jobs
    held: Hours  # worst case still reserved for attempts that have not settled
    rates: Rates
    charged: Hours = field(default_factory=Hours)  # what the caps bind: the journal's used + held
    stale: int = 0  # holds of ended attempts among ``held`` (``sync`` settles them)
    gpus: GpuUse = field(default_factory=GpuUse)  # the attempts' GPU-hours: allocated, used, idle

    PARTS = ("attempts", "start_up_and_gaps", "selection_jobs", "held")

    @property
    def parts(self) -> dict[str, Hours]:
        return dict(zip(self.PARTS, (self.attempts, self.overhead, self.selection, self.held)))

    @property
    def total(self) -> Hours:
        return self.attempts + self.overhead + self.selection + self.held

    @property
    def cost(self) -> float:
        return self.total.cost(self.rates)

    def line(self) -> str:
        """One line, the same in every command: the total, then its parts in GPU-h (in CPU-h for a
        search that used no GPU)."""
        t = self.total
        unit, of = ("GPU-h", lambda h: h.gpu_hours) if t.gpu_hours > 0 else ("CPU-h", lambda h: h.cpu_hours)
        parts = " + ".join(f"{name.replace('_', ' ')} {shown(of(h))}" for name, h in self.parts.items())
        stale = f"; {self.stale} holds of ended attempts (`parcel-hpc sync` settles them)" if self.stale else ""
        return f"{shown(t.gpu_hours)} GPU-h, {shown(t.cpu_hours)} CPU-h, cost {shown(self.cost)} ({unit}: {parts}){stale}"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.total.to_json(self.rates),
            "parts": {name: h.to_json(self.rates) for name, h in self.parts.items()},
            "charged": self.charged.to_json(self.rates),
            "stale_holds": self.stale,
            "gpu_use": self.gpus.to_json(),
        }


@dataclass(frozen=True)
class JobHours:
    """A job that is no trial's attempt (a selection job): its start, end and resources."""

    started: float
    ended: float
    gpus: int
    cpus: int

    @property
    def hours(self) -> Hours:
        h = hours_between(self.started, self.ended)
        return Hours(self.gpus * h, self.cpus * h)


def attempt_spend(record: TrialRecord, attempt: Attempt, holds: Mapping[ReservationKey, Hold]) -> tuple[Hours, Hours]:
    """(used, held) of one attempt (pure): what the journal settled for it, or still holds; one that
    never reserved, its start to end (nothing while it runs)."""
    hold = holds.get(ReservationKey(record.trial_id, attempt.number))
    if hold is not None:
        if hold.state.is_closed():
            return Hours(hold.used_gpu_hours, hold.used_cpu_hours), Hours()
        return Hours(), Hours(hold.reserved_gpu_hours, hold.reserved_cpu_hours)
    if attempt.started is None or attempt.ended is None:
        return Hours(), Hours()
    return Hours(*attempt_usage(record.spec.resources, attempt.started, attempt.ended, attempt.gpus)), Hours()


def job_overhead(records: Iterable[TrialRecord]) -> Hours:
    """The hours jobs held their resources outside any attempt (pure), per run of a job (job id and
    restart count): from its worker process's start to its first attempt's, and from each
    attempt's end to the next one's start (a pack runs its trials in turn)."""
    runs: dict[tuple[str, int], list[tuple[TrialRecord, Attempt]]] = {}
    for r in records:
        for a in r.attempts:
            if a.job_id and a.started is not None:
                runs.setdefault((a.job_id, a.restart_count), []).append((r, a))
    total = Hours()
    for ran in runs.values():
        ran.sort(key=lambda item: item[1].started or 0.0)
        first, began = ran[0][1], min((a.process_started for _, a in ran if a.process_started is not None), default=None)
        idle = [(began, first.started)] if began is not None else []
        idle += [(before.ended, after.started) for (_, before), (_, after) in zip(ran, ran[1:]) if before.ended is not None]
        res = ran[0][0].spec.resources
        gpus, cpus = first.gpus_or(int(res.get("gpus", 0))), int(res.get("cpus", 1))
        for start, end in idle:
            h = hours_between(start, cast(float, end))  # every attempt in ``ran`` started
            total += Hours(gpus * h, cpus * h)
    return total


def search_spend(records: Sequence[TrialRecord], journal: JournalView | None, selection_jobs: Sequence[JobHours], rates: Rates) -> Spend:
    """The spend of ``records``' trials and of ``selection_jobs`` (pure). Every hold the journal
    has for those trials counts, whether or not the ledger shows its attempt (the journal is what
    the caps bind), so ``charged`` is the journal's used + held for them."""
    holds: Mapping[ReservationKey, Hold] = journal.holds if journal is not None else {}
    ids = {r.trial_id for r in records}
    mine = {k: h for k, h in holds.items() if k.trial_id in ids}
    attempts = held = charged = Hours()
    for h in mine.values():
        part = Hours(h.used_gpu_hours, h.used_cpu_hours) if h.state.is_closed() else Hours(h.reserved_gpu_hours, h.reserved_cpu_hours)
        charged += part
        if h.state.is_closed():
            attempts += part
        else:
            held += part
    gpus = GpuUse()
    for r in records:
        for a in r.attempts:
            used = attempt_spend(r, a, mine)[0]
            gpus += GpuUse.of(used.gpu_hours, a.device_use)
            if ReservationKey(r.trial_id, a.number) not in mine:
                attempts += used
    selection = Hours()
    for job in selection_jobs:
        selection += job.hours
    return Spend(attempts, job_overhead(records), selection, held, rates, charged, len(stale_holds(records, mine)), gpus)


# --- the read edge ------------------------------------------------------------------------------


def selection_jobs(search: SearchDir) -> list[JobHours]:
    """Every selection job that recorded its result: each frozen selection's rerun, and the final."""
    store = SelectionStore(search)
    results = [store.result(n, JobRole.RERUN) for n in store.frozen_numbers()] + [store.result(0, JobRole.FINAL)]
    out = []
    for result in results:
        if result is None:
            continue
        job = result["job"]
        allocated = job.get("facts", {}).get("gpus")  # what its scheduler gave it; older results: the request
        out.append(
            JobHours(job["started_at"], job["ended_at"], int(job["resources"]["gpus"] if allocated is None else allocated), int(job["resources"]["cpus"]))
        )
    return out


def read_spend(search: SearchDir, records: Sequence[TrialRecord] | None = None) -> Spend:
    """The search's spend, read without writing; ``records``: the caller's, when it has just read
    them (``status`` passes them as recorded, before it folds any resolution in memory)."""
    records = list(search.records()) if records is None else records
    return search_spend(records, BudgetLedger.read(search.path), selection_jobs(search), search_caps(search.contract()).rates)
