"""A search's spend: one figure, one breakdown, what every read command and the packet print.

``search_spend`` (pure) counts each hour once, from the ledger and the budget journal:

- attempts: the trials' own attempts, each from its start to its end as ``Attempt.counted_end``
  gives it (the one rule): its own end when its worker said how it ended; for one that did not
  (lost, resolved by someone else) the end of its run as the scheduler recorded it (the node
  failure's moment), else where the ledger noticed the loss, a provisional figure. One the
  journal settled counts what it settled (the same rule: ``budget.attempt_usage``); one that never
  reserved (refused at admission, budget_exhausted), its figure by the same rule;
- start-up and gaps: what a job held no attempt of which ran, per run of the job: once the
  scheduler's record of the run is recorded (``Accounted``: sacct's start, end and hours), the
  run's hours less its attempts' (the batch script, the interpreter, a pack's gaps, the moments
  after the last trial); until then, from its worker process's start to its first trial and
  between one trial's end and the next one's start, provisionally;
- selection jobs: the winner's rerun with the baseline, and the final evaluation, each its own
  start to end times the resources it held;
- held: the worst case still reserved for attempts that have not settled (running ones, and holds
  an ended attempt left: ``reconcile`` flags those, ``sync`` settles them).

``total = attempts + start-up and gaps + selection jobs + held``, so once every run is recorded the
trials' hours are sacct's to the second. ``provisional``: the part of the total counted by the
ledger's clock because the scheduler's record of its run is not recorded yet (a SLURM search; the
local executor has no accounting, its ledger is the record); the launch's follower records runs as
sacct files them, ``sync`` and ``resubmit`` too, and ``reconcile`` settles at read time what sacct
filed. Cost is priced at the search's rates. The budget's caps bind ``charged``: the journal's used
+ held (the attempts that reserved, and what is held), the one "charged to the caps" figure
(``charged_line``); start-up and gaps, selection jobs and attempts that never reserved are spent
but were never reserved. GPUs are counted once, by ``budget.counted_gpus``.

``stale_holds`` (pure) finds holds that do not charge what their attempt used: held for an attempt
that ended, or settled before the scheduler's record of its run changed its end (restated);
``lifecycle.settlement`` settles and restates them, ``reconcile`` flags them.

``read_spend`` is the read edge; it never writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from parcel_hpc.budget import BudgetLedger, Hold, JournalView, KeyState, Rates, ReservationKey, attempt_usage, counted_gpus, hours_between, search_caps
from parcel_hpc.ledger import Attempt, DeviceUse, JobRole, SearchDir, TrialRecord
from parcel_hpc.ledger.events import Accounted
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.selection.store import SelectionStore

DECIMALS = 4  # every printed figure: hours and cost, the same rounding everywhere
JSON_DECIMALS = 6  # micro-hours: the journal's own resolution
ROUNDING_H = 0.5 * 10**-DECIMALS  # two figures closer than this print the same: a difference above it is one


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

    def __sub__(self, other: Hours) -> Hours:
        return Hours(self.gpu_hours - other.gpu_hours, self.cpu_hours - other.cpu_hours)

    def differs(self, other: Hours) -> bool:
        """Whether the two differ by more than printing rounds away, in GPU- or CPU-hours."""
        return abs(self.gpu_hours - other.gpu_hours) > ROUNDING_H or abs(self.cpu_hours - other.cpu_hours) > ROUNDING_H

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
        """One attempt's (pure); a gang's, rank by rank: each rank's equal share of the hours at its own
        reading, so a rank that told none leaves its share unread, not its peers'."""
        if gpu_hours <= 0:
            return cls()
        if use is not None and use.rank_utilization:
            share = gpu_hours / len(use.rank_utilization)
            return sum((cls.of(share, use.of_rank(rank)) for rank in range(len(use.rank_utilization))), cls())
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
    stale: int = 0  # holds that do not charge what their attempt used (``sync`` settles or restates them)
    gpus: GpuUse = field(default_factory=GpuUse)  # the attempts' GPU-hours: allocated, used, idle
    provisional: Hours = field(default_factory=Hours)  # of the total: counted by the ledger's clock until the scheduler's record of the run is recorded

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
        search that used no GPU), and what of it is provisional."""
        t = self.total
        unit, of = ("GPU-h", lambda h: h.gpu_hours) if t.gpu_hours > 0 else ("CPU-h", lambda h: h.cpu_hours)
        parts = " + ".join(f"{name.replace('_', ' ')} {shown(of(h))}" for name, h in self.parts.items())
        stale = f"; {self.stale} budget holds that do not charge what their attempt used (`parcel-hpc sync` settles them)" if self.stale else ""
        provisional = (
            f"; {shown(of(self.provisional))} {unit} of it provisional: counted by the ledger's clock until the scheduler's record of those runs"
            " is recorded (the launch records it, or `parcel-hpc sync`)"
            if self.provisional.differs(Hours())
            else ""
        )
        return f"{shown(t.gpu_hours)} GPU-h, {shown(t.cpu_hours)} CPU-h, cost {shown(self.cost)} ({unit}: {parts}){provisional}{stale}"

    def charged_line(self, gpu_hours_cap: float, cost_cap: float) -> str:
        """What the budget's caps bind, against them: the one "charged to the caps" figure (``list``
        and ``reconcile --root`` print it)."""
        return f"{shown(self.charged.gpu_hours)} / {gpu_hours_cap:g} GPU-h, {shown(self.charged.cost(self.rates))} / {cost_cap:g}"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.total.to_json(self.rates),
            "parts": {name: h.to_json(self.rates) for name, h in self.parts.items()},
            "charged": self.charged.to_json(self.rates),
            "provisional": self.provisional.to_json(self.rates),
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


def attempt_hours(record: TrialRecord, attempt: Attempt, until: float | None = None) -> Hours | None:
    """What one attempt used (pure): its start to ``Attempt.counted_end`` (the one rule), never past
    its time limit, times the GPUs it was allocated (``budget.counted_gpus``) and its CPUs; the
    formula its worker settles with (``budget.attempt_usage``), in the journal's micro-hours, so an
    attempt counts exactly what its hold settled. While it runs: to ``until`` when given (its job
    seen gone, its run's end so far), else None."""
    end = attempt.counted_end()
    end = end if end is not None else until
    if attempt.started is None or end is None:
        return None
    gpu, cpu = attempt_usage(record.spec.resources, attempt.started, end, attempt.gpus)
    return Hours(round(gpu, JSON_DECIMALS), round(cpu, JSON_DECIMALS))


def is_provisional(record: TrialRecord, attempt: Attempt) -> bool:
    """Its end is the ledger's noticing of a loss, until the scheduler's record of its run is
    recorded (where the scheduler files one: ``Backend.files_runs``)."""
    return backend_of(record.executor).files_runs and not attempt.settled_by_scheduler()


@dataclass(frozen=True)
class AttemptSpend:
    used: Hours  # what it used (settled, or never reserved); nothing while it runs
    held: Hours  # its worst case, still reserved: it has not settled
    provisional: bool = False  # ``used`` ends where the ledger noticed its loss: the scheduler's record may change it


def attempt_spend(record: TrialRecord, attempt: Attempt, holds: Mapping[ReservationKey, Hold]) -> AttemptSpend:
    """What one attempt used and still holds (pure): a hold still held counts its worst case; a
    closed one what it settled, or, once the scheduler's record of its run is recorded, its figure
    by that record (``sync`` restates the journal to it: ``stale_holds``); one that never
    reserved, its figure."""
    hold = holds.get(ReservationKey(record.trial_id, attempt.number))
    if hold is not None and not hold.state.is_closed():
        return AttemptSpend(Hours(), Hours(hold.reserved_gpu_hours, hold.reserved_cpu_hours))
    used = attempt_hours(record, attempt)
    provisional = used is not None and is_provisional(record, attempt)
    if hold is not None and (used is None or attempt.run is None or hold.state is KeyState.RELEASED):
        return AttemptSpend(Hours(hold.used_gpu_hours, hold.used_cpu_hours), Hours(), provisional)
    return AttemptSpend(used or Hours(), Hours(), provisional)


def run_hours(run: Accounted, requested_gpus: int) -> Hours:
    """The hours of a run as the scheduler charged it: its elapsed seconds times what it allocated
    (GPUs by ``budget.counted_gpus``)."""
    h = run.elapsed_s / 3600.0
    return Hours(counted_gpus(run.gpus, requested_gpus) * h, run.cpus * h)


@dataclass(frozen=True)
class RunSpend:
    """One run of one job (its job id and restart count), as the spend counts it."""

    key: tuple[str, int]
    attempts: Hours  # its attempts' hours (every attempt's figure, held or not)
    rest: Hours  # start-up and gaps: what the job held no attempt of which ran
    provisional: bool  # ``rest`` is the ledger's estimate: a SLURM run whose record is not recorded yet


def run_spends(records: Iterable[TrialRecord]) -> dict[tuple[str, int], RunSpend]:
    """Every run of every job of ``records`` (pure), whether an attempt ran in it or only the
    scheduler's record says it ran (a requeued pack that found its trials done)."""
    ran: dict[tuple[str, int], list[tuple[TrialRecord, Attempt]]] = {}
    recorded: dict[tuple[str, int], tuple[Accounted, TrialRecord]] = {}
    for r in records:
        for a in r.attempts:
            if a.job_id and a.started is not None:
                ran.setdefault((a.job_id, a.restart_count), []).append((r, a))
        for run in r.accounted:
            recorded.setdefault(run.key, (run, r))
    out = {}
    for key in dict.fromkeys([*ran, *recorded]):
        attempts = sorted(ran.get(key, []), key=lambda item: cast(float, item[1].started))  # ran holds started attempts only
        used = Hours()
        for r, a in attempts:
            used += attempt_hours(r, a) or Hours()
        if key in recorded:
            run, owner = recorded[key]
            out[key] = RunSpend(key, used, run_hours(run, owner.spec.shape.gpus) - used, False)
        else:
            filed_later = any(backend_of(r.executor).files_runs for r, _ in attempts)
            out[key] = RunSpend(key, used, _estimated_rest(attempts), filed_later)
    return out


def _estimated_rest(ran: Sequence[tuple[TrialRecord, Attempt]]) -> Hours:
    """A run's start-up and gaps by the ledger's clock: from its worker process's start to its first
    attempt's, and from each attempt's end to the next one's start (a pack runs its trials in turn)."""
    first = ran[0][1]
    began = min((a.process_started for _, a in ran if a.process_started is not None), default=None)
    idle = [(began, cast(float, first.started))] if began is not None else []
    ends = [a.counted_end() for _, a in ran]
    idle += [(end, cast(float, after.started)) for end, (_, after) in zip(ends, ran[1:]) if end is not None]  # every attempt in ``ran`` started
    res = ran[0][0].spec.resources
    gpus, cpus = first.gpus_or(int(res.get("gpus", 0))), int(res.get("cpus", 1))
    total = Hours()
    for start, end in idle:
        h = hours_between(start, end)
        total += Hours(gpus * h, cpus * h)
    return total


def search_spend(records: Sequence[TrialRecord], journal: JournalView | None, selection_jobs: Sequence[JobHours], rates: Rates) -> Spend:
    """The spend of ``records``' trials and of ``selection_jobs`` (pure). Every hold the journal
    has for those trials counts, whether or not the ledger shows its attempt (the journal is what
    the caps bind), so ``charged`` is the journal's used + held for them."""
    holds: Mapping[ReservationKey, Hold] = journal.holds if journal is not None else {}
    ids = {r.trial_id for r in records}
    mine = {k: h for k, h in holds.items() if k.trial_id in ids}
    attempts = held = charged = provisional = Hours()
    for h in mine.values():
        charged += Hours(h.used_gpu_hours, h.used_cpu_hours) if h.state.is_closed() else Hours(h.reserved_gpu_hours, h.reserved_cpu_hours)
        if not h.state.is_closed():
            held += Hours(h.reserved_gpu_hours, h.reserved_cpu_hours)
    seen = set()
    gpus = GpuUse()
    for r in records:
        for a in r.attempts:
            spent = attempt_spend(r, a, mine)
            seen.add(ReservationKey(r.trial_id, a.number))
            gpus += GpuUse.of(spent.used.gpu_hours, a.device_use)
            attempts += spent.used
            if spent.provisional:
                provisional += spent.used
    for key, h in mine.items():  # a hold whose attempt the ledger does not show (its started line torn): what it settled
        if key not in seen and h.state.is_closed():
            attempts += Hours(h.used_gpu_hours, h.used_cpu_hours)
    overhead = Hours()
    for run in run_spends(records).values():
        overhead += run.rest
        if run.provisional:
            provisional += run.rest
    selection = Hours()
    for job in selection_jobs:
        selection += job.hours
    return Spend(attempts, overhead, selection, held, rates, charged, len(stale_holds(records, mine)), gpus, provisional)


@dataclass(frozen=True)
class StaleHold:
    """A budget hold that does not charge what its attempt used: still held for an attempt that
    ended (or whose job is gone, or whose run the scheduler recorded), or settled before the
    scheduler's record of its run gave it another end (it is restated)."""

    key: ReservationKey
    used: Hours  # what the attempt used, as the spend counts it: what the hold should charge
    charged: Hours  # what the journal charges it now: its worst case while held, or what it settled
    settled: bool  # the journal settled it already: restated, not settled


def stale_holds(records: Iterable[TrialRecord], holds: Mapping[ReservationKey, Hold], gone_at: Mapping[str, float] | None = None) -> list[StaleHold]:
    """Holds of ``records``' attempts that do not charge what the attempt used (pure). ``gone_at``:
    trial -> when its job was seen gone (``cancel``), which ends its attempts that never said how.
    An attempt with no recorded start keeps its hold: its hours are unknown, and a hold is never
    settled for less than was used."""
    gone_at = gone_at or {}
    out = []
    for r in records:
        for a in r.attempts:
            key = ReservationKey(r.trial_id, a.number)
            hold = holds.get(key)
            if hold is None or a.started is None:
                continue
            if hold.state is KeyState.HELD:
                used = attempt_hours(r, a, until=gone_at.get(r.trial_id))
                if used is not None:  # else it runs
                    out.append(StaleHold(key, used, Hours(hold.reserved_gpu_hours, hold.reserved_cpu_hours), False))
            elif hold.state is KeyState.SETTLED and a.run is not None:
                restated = attempt_hours(r, a)
                charged = Hours(hold.used_gpu_hours, hold.used_cpu_hours)
                if restated is not None and _micro(restated) != _micro(charged):
                    out.append(StaleHold(key, restated, charged, True))
    return out


def _micro(h: Hours) -> tuple[int, int]:
    """Hours as the journal stores them (micro-hours)."""
    return round(h.gpu_hours * 1_000_000), round(h.cpu_hours * 1_000_000)


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
        gpus = counted_gpus(None if allocated is None else int(allocated), int(job["resources"]["gpus"]))
        out.append(JobHours(job["started_at"], job["ended_at"], gpus, int(job["resources"]["cpus"])))
    return out


def read_spend(search: SearchDir, records: Sequence[TrialRecord] | None = None) -> Spend:
    """The search's spend, read without writing; ``records``: the caller's, when it has just read
    them (``status`` passes them as recorded, before it folds any resolution in memory)."""
    records = list(search.records()) if records is None else records
    return search_spend(records, BudgetLedger.read(search.path), selection_jobs(search), search_caps(search.contract()).rates)
