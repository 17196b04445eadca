"""Reconcile a search's ledger with the scheduler's accounting (pure).

Input: the trial records (what the ledger believes), the scheduler's job runs (sacct rows, or the
local executor's own records), the jobs listed under the search's name or account (for orphans),
and the caps. Output: a ``Reconciliation`` with one line per job run and per trial, the flags an
admin must look at, hours wasted by cause, and the campaign figures. No I/O here; ``run.py`` asks
sacct and writes reports.

Usage is the scheduler's: GPU-hours = AllocTRES gres/gpu x ElapsedRaw, per job run, to the second.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ..budget import BudgetCaps
from ..ledger import AttemptEnd, Cause, TrialRecord, TrialState
from ..report import counts_by_state
from .runs import JobRun, runs_by_job
from .states import JobState

SECONDS_PER_HOUR = 3600.0
# slurmdbd files a job's last record a moment after the job ends (seconds, a minute when busy).
# Within this long of the ledger's last word on a job, a missing or short record is lag, not a fault.
ACCOUNTING_GRACE_S = 300.0
WASTE_CAUSES = ("preemption", "node_failure", "timeout", "cancelled", "no_space", "lost", "quarantine", "reproducible_failure", "pruned")


@dataclass(frozen=True)
class AttemptLine:
    trial_id: str  # "" for an orphan
    job_id: str
    run: int  # 0 for the job's first run, 1 after its first requeue...
    state: str
    node: str
    submit: int | None
    start: int | None
    end: int | None
    elapsed_s: int
    gpus: int
    cpus: int
    gpu_hours: float
    cpu_hours: float
    cost: float
    queue_wait_s: int | None
    ledger_attempt: int | None  # the ledger's attempt number this run was matched to
    ledger_how: str  # how the ledger says that attempt ended ("" while it thinks it runs)
    waste: str  # a WASTE_CAUSES entry, or "" for useful hours


@dataclass(frozen=True)
class TrialLine:
    trial_id: str
    state: str
    attempts: int
    gpu_hours: float
    cpu_hours: float
    wall_s: int
    cost: float
    queue_wait_s: tuple[int, ...]  # every run that started
    effective: bool  # a usable, correctly attributed result


@dataclass(frozen=True)
class Flag:
    kind: str  # orphan | running_but_ended | attempt_mismatch | state_mismatch | unknown_to_scheduler
    trial_id: str
    job_id: str
    detail: str


@dataclass(frozen=True)
class Pending:
    """A job the scheduler has not filed in full yet: its hours may still change."""

    trial_id: str
    job_id: str
    detail: str


@dataclass(frozen=True)
class Reconciliation:
    campaign: str
    objective: str
    source: str  # "sacct", "sacct-file:<path>" or "local executor"
    attempts: tuple[AttemptLine, ...]
    trials: tuple[TrialLine, ...]
    flags: tuple[Flag, ...]
    waste_hours: Mapping[str, float]  # GPU-hours by cause (CPU-hours where a search has no GPUs)
    figures: Mapping[str, float | int | None]
    spend: Mapping[str, Mapping[str, float]]  # per ceiling: used, cap, left
    counts: Mapping[str, int] = field(default_factory=dict)
    pending: tuple[Pending, ...] = ()

    @property
    def complete(self) -> bool:
        """Every job of the search is filed in full: the figures are final."""
        return not self.pending

    def to_json(self) -> dict:
        return {
            "campaign": self.campaign,
            "complete": self.complete,
            "pending": [asdict(p) for p in self.pending],
            "objective": self.objective,
            "source": self.source,
            "counts": dict(self.counts),
            "figures": dict(self.figures),
            "spend": {k: dict(v) for k, v in self.spend.items()},
            "waste_hours": dict(self.waste_hours),
            "flags": [asdict(f) for f in self.flags],
            "trials": [asdict(t) for t in self.trials],
            "attempts": [asdict(a) for a in self.attempts],
        }


def reconcile(
    campaign: str,
    objective: str,
    source: str,
    records: Sequence[TrialRecord],
    runs: Sequence[JobRun],
    listed: Sequence[JobRun],
    caps: BudgetCaps,
    ledger_used_gpu_hours: float | None = None,
    now: float | None = None,
) -> Reconciliation:
    """``runs``: the scheduler's runs of every job the ledger recorded; ``listed``: every job
    the scheduler holds under the search's name or account (orphans are those the ledger lacks).

    A job the scheduler has not filed in full (still active, or its record missing or short within
    ``ACCOUNTING_GRACE_S`` of the ledger's last word on it, by ``now``) is pending, never a flag."""
    by_trial = {r.trial_id: r for r in records}
    job_owner = {job: r.trial_id for r in records for job in r.jobs}
    by_job = runs_by_job(runs)
    flags: list[Flag] = []
    lines: list[AttemptLine] = []
    pending: list[Pending] = []

    for job, job_runs in by_job.items():
        tid = job_owner.get(job, "")
        rec = by_trial.get(tid)
        started_runs = [a for a in job_runs if a.start is not None]
        ledger_attempts = [a for a in rec.attempts if a.job_id == job and a.started is not None] if rec else []
        lag = _filing_lag(job, job_runs, started_runs, ledger_attempts, now) if rec is not None else ""
        if lag:
            pending.append(Pending(tid, job, lag))
        if rec is not None and len(started_runs) != len(ledger_attempts) and not lag.startswith(_COUNT_LAG):
            flags.append(Flag("attempt_mismatch", tid, job, f"sacct shows {len(started_runs)} runs that started, the ledger {len(ledger_attempts)} attempts"))
        matched = dict(zip((a.attempt for a in started_runs), ledger_attempts))
        for a in job_runs:
            led = matched.get(a.attempt)
            how = led.how.value if led is not None and led.how is not None else ""
            if led is not None and led.how is None and a.state.is_terminal():
                flags.append(Flag("running_but_ended", tid, job, f"the ledger believes attempt {led.number} runs; the scheduler says {a.state.text}"))
            if led is not None and led.how is not None:
                problem = _state_mismatch(led.how, a.state)
                if problem:
                    flags.append(Flag("state_mismatch", tid, job, problem))
            lines.append(_line(tid, a, led, how, _waste(rec, led, a), caps))

    known = set(job_owner)
    orphans: set[str] = set()
    for a in listed:
        if a.job_id not in known and a.job_id not in by_job:
            if a.job_id not in orphans:
                orphans.add(a.job_id)
                flags.append(
                    Flag("orphan", "", a.job_id, f"job {a.job_id} ({a.state.text}, {a.node_list}) runs under the search's name but the ledger does not know it")
                )
            lines.append(_line("", a, None, "", "", caps))
    for r in records:
        for job in r.jobs:
            if job in by_job:
                continue
            last = _last_word(r, job)
            if last is None and r.state.is_finished():
                continue  # never ran (cancelled while pending: sacct may file it as an unexpanded 123_[4-9])
            if now is not None and (last is None or now - last < ACCOUNTING_GRACE_S):
                pending.append(Pending(r.trial_id, job, "the scheduler has filed no record of this job yet"))
            else:
                flags.append(Flag("unknown_to_scheduler", r.trial_id, job, "the ledger recorded this job but the scheduler has no accounting for it"))

    trials = tuple(_trial_line(r, [l for l in lines if l.trial_id == r.trial_id]) for r in records)
    total_gpu = sum(l.gpu_hours for l in lines)
    total_cpu = sum(l.cpu_hours for l in lines)
    waste = {c: 0.0 for c in WASTE_CAUSES}
    for l in lines:
        if l.waste:
            waste[l.waste] += l.gpu_hours if l.gpus else l.cpu_hours
    counts = counts_by_state(records)
    figures = _figures(lines, trials, total_gpu, total_cpu, caps)
    spend = {
        "gpu_hours": {"used": total_gpu, "cap": caps.gpu_hours_cap, "left": caps.gpu_hours_cap - total_gpu},
        "cost": {"used": caps.rates.cost(total_gpu, total_cpu), "cap": caps.cost_cap, "left": caps.cost_cap - caps.rates.cost(total_gpu, total_cpu)},
        "trials": {"used": float(len(records)), "cap": float(caps.max_trials), "left": float(caps.max_trials - len(records))},
    }
    if ledger_used_gpu_hours is not None:
        spend["gpu_hours"]["ledger_used"] = ledger_used_gpu_hours
    return Reconciliation(campaign, objective, source, tuple(lines), trials, tuple(flags), waste, figures, spend, counts, tuple(pending))


def _last_word(record: TrialRecord, job: str) -> float | None:
    """When the ledger last heard of ``job`` running or ending (None: it never started)."""
    times = [t for a in record.attempts if a.job_id == job for t in (a.started, a.ended) if t is not None]
    return max(times) if times else None


_COUNT_LAG = "not yet told: "  # a pending detail that explains a difference in run counts


def _filing_lag(job: str, job_runs: Sequence[JobRun], started_runs: Sequence[JobRun], ledger_attempts: Sequence, now: float | None) -> str:
    """Why ``job``'s accounting is not final yet, or "" when it is (pure). A difference in run counts
    is lag only while it is fresh: sacct has not filed a run the ledger saw start, or the ledger has
    not heard from a run sacct saw start, within ``ACCOUNTING_GRACE_S`` by ``now``."""
    if now is not None and len(started_runs) < len(ledger_attempts):
        if now - max(a.started for a in ledger_attempts) < ACCOUNTING_GRACE_S:
            return f"{_COUNT_LAG}sacct has filed {len(started_runs)} of the {len(ledger_attempts)} runs the ledger saw start"
    if now is not None and len(started_runs) > len(ledger_attempts):
        if now - max(a.start for a in started_runs) < ACCOUNTING_GRACE_S:
            return f"{_COUNT_LAG}run {len(started_runs) - 1} started moments ago and its worker has not said so yet"
    active = [a for a in job_runs if a.state.is_active()]
    if active:
        return f"the scheduler still has job {job} {active[-1].state.text}: its hours are not final"
    return ""


def _line(tid: str, a: JobRun, led, how: str, waste: str, caps: BudgetCaps) -> AttemptLine:
    return AttemptLine(
        tid,
        a.job_id,
        a.attempt,
        a.state.text,
        a.node_list,
        a.submit,
        a.start,
        a.end,
        a.elapsed_s,
        a.gpus,
        a.cpus,
        a.gpu_hours,
        a.cpu_hours,
        caps.rates.cost(a.gpu_hours, a.cpu_hours),
        a.queue_wait_s,
        led.number if led is not None else None,
        how,
        waste,
    )


def _waste(rec: TrialRecord | None, led, a: JobRun) -> str:
    """Why this run's hours bought no result (empty: they did)."""
    if rec is None:
        return ""
    if led is not None and (led.how is AttemptEnd.QUARANTINED or led.number <= rec.tainted_upto):
        return "quarantine"
    cause = led.cause if led is not None else None
    if a.state is JobState.NODE_FAIL or cause is Cause.NODE_FAIL:
        return "node_failure"
    if a.state is JobState.PREEMPTED or cause is Cause.PREEMPTED:
        return "preemption"
    if cause is Cause.TIMEOUT or a.state is JobState.TIMEOUT:
        return "timeout"
    if cause is Cause.CANCELLED or a.state.is_cancelled():
        return "cancelled"
    if cause is Cause.NO_SPACE:
        return "no_space"
    if led is not None and led.how is AttemptEnd.LOST:
        return "lost"
    if rec.state is TrialState.FAILED:
        return "reproducible_failure"
    if rec.state is TrialState.PRUNED:
        return "pruned"
    return ""


def _state_mismatch(how: AttemptEnd, state: JobState) -> str:
    if state.is_active():
        return ""
    if how in (AttemptEnd.COMPLETED, AttemptEnd.PRUNED, AttemptEnd.REJECTED) and state is not JobState.COMPLETED:
        return f"the ledger says the attempt ended {how.value}; the scheduler says {state.text}"
    if how is AttemptEnd.FAILED and state is JobState.COMPLETED:
        return "the ledger says the attempt failed; the scheduler says COMPLETED"
    return ""


def _trial_line(r: TrialRecord, lines: list[AttemptLine]) -> TrialLine:
    effective = r.state.is_result() and not (r.state is TrialState.COMPLETED and r.metric is None)
    return TrialLine(
        r.trial_id,
        r.state.value,
        len(lines),
        sum(l.gpu_hours for l in lines),
        sum(l.cpu_hours for l in lines),
        sum(l.elapsed_s for l in lines),
        sum(l.cost for l in lines),
        tuple(l.queue_wait_s for l in lines if l.queue_wait_s is not None),
        effective,
    )


def _figures(lines: Sequence[AttemptLine], trials: Sequence[TrialLine], gpu_h: float, cpu_h: float, caps: BudgetCaps) -> dict:
    waits = [l.queue_wait_s for l in lines if l.queue_wait_s is not None and l.trial_id]
    submits = [l.submit for l in lines if l.submit is not None and l.trial_id]
    ends = [l.end for l in lines if l.end is not None and l.trial_id]
    wall_h = (max(ends) - min(submits)) / SECONDS_PER_HOUR if submits and ends and max(ends) > min(submits) else None
    finished = sum(1 for t in trials if TrialState(t.state).is_finished() and t.state != TrialState.CANCELLED)
    effective = sum(1 for t in trials if t.effective)
    cost = caps.rates.cost(gpu_h, cpu_h)
    return {
        "gpu_hours": gpu_h,
        "cpu_hours": cpu_h,
        "cost": cost,
        "wall_clock_hours": wall_h,
        "queue_wait_mean_s": statistics.fmean(waits) if waits else None,
        "queue_wait_median_s": statistics.median(waits) if waits else None,
        "queue_wait_max_s": max(waits) if waits else None,
        "trials_per_hour": finished / wall_h if wall_h else None,
        "effective_results": effective,
        "effective_trials_per_hour": effective / wall_h if wall_h else None,
        "cost_per_effective_result": cost / effective if effective else None,
    }


def local_runs(records: Iterable[TrialRecord]) -> list[JobRun]:
    """The local executor's own record of each attempt, as job runs in sacct's shape (no scheduler to ask)."""
    out = []
    line = 0
    for r in records:
        gpus, cpus = int(r.spec.resources.get("gpus", 0)), int(r.spec.resources.get("cpus", 1))
        runs_of_job: dict[str, int] = {}
        for a in r.attempts:
            if a.started is None or not a.job_id:
                continue
            line += 1
            run = runs_of_job.get(a.job_id, 0)
            runs_of_job[a.job_id] = run + 1
            end = a.ended
            state = _LOCAL_STATE.get(a.how, JobState.RUNNING) if a.how is not None else JobState.RUNNING
            out.append(
                JobRun(
                    job_id=a.job_id,
                    raw_job_id=int(a.job_id) if a.job_id.isdigit() else 0,
                    base_job_id=int(a.job_id) if a.job_id.isdigit() else 0,
                    array_task=None,
                    attempt=run,
                    state=state,
                    exit_status=0,
                    exit_signal=0,
                    node_list=a.host,
                    partition="local",
                    account="",
                    submit=int(a.started),
                    start=int(a.started),
                    end=int(end) if end is not None else None,
                    elapsed_s=int(round((end if end is not None else a.started) - a.started)),
                    gpus=gpus,
                    cpus=cpus,
                    line=line,
                )
            )
    return out


_LOCAL_STATE = {
    AttemptEnd.COMPLETED: JobState.COMPLETED,
    AttemptEnd.PRUNED: JobState.COMPLETED,
    AttemptEnd.REJECTED: JobState.COMPLETED,
    AttemptEnd.BUDGET_EXHAUSTED: JobState.COMPLETED,
    AttemptEnd.FAILED: JobState.FAILED,
    AttemptEnd.INTERRUPTED: JobState.REQUEUED,
    AttemptEnd.LOST: JobState.CANCELLED,
    AttemptEnd.QUARANTINED: JobState.COMPLETED,
}
