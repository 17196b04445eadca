"""Reconcile a search's ledger with the scheduler's accounting (pure).

Input: the trial records (what the ledger believes), the scheduler's runs of the ledger's jobs
(sacct rows, or the local executor's own records), the runs listed under the search's name (as
columns: an exported dump holds every orphan of a month), and the caps. Output: a
``Reconciliation`` with one line per job run and per trial, the flags an admin must look at, hours
wasted by cause, and the campaign figures. The ledger's jobs are matched run by run to its
attempts; the jobs it does not know stay columns (``columns.py``) into the printed report. No I/O
here; ``search_report.py`` asks sacct and writes reports.

Usage is the scheduler's: GPU-hours = AllocTRES gres/gpu x ElapsedRaw, per job run, to the second.
A job that ran one trial is that trial's, run by run; a pack's runs are split as the spend splits
them (``accounting.spend``): each attempt its own hours (its start to ``Attempt.counted_end``), the
rest one line of the job ("start-up and gaps"), so the lines of a run add up to sacct's. The runs sacct filed that the
ledger has not recorded yet are settled here in memory (``TrialRecord.with_runs``: a read command
writes nothing) and listed as ``unrecorded``; a run the ledger recorded is compared with sacct's
record of it, and any difference above rounding is a flag (``FlagKind.HOURS_MISMATCH``), so "no
flags" is a statement that can fail.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import islice
from typing import cast

import pyarrow as pa

from parcel_hpc.accounting import columns
from parcel_hpc.accounting.ranks import RankLine, StepLine
from parcel_hpc.accounting.spend import GpuUse, Hours, JobHours, Spend, StaleHold, attempt_hours, run_hours, search_spend, shown, stale_holds
from parcel_hpc.budget import BudgetCaps, JournalView
from parcel_hpc.ledger import Attempt, AttemptEnd, Cause, TrialRecord, TrialState
from parcel_hpc.ledger.events import Accounted, field_names
from parcel_hpc.ledger.summary import counts_by_state
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.scheduler.run_table import runs_table
from parcel_hpc.scheduler.runs import JobRun, runs_by_job
from parcel_hpc.scheduler.states import JobState

SECONDS_PER_HOUR = 3600.0
# slurmdbd files a job's last record a moment after the job ends (seconds, a minute when busy).
# Within this long of the ledger's last word on a job, a missing or short record is lag, not a fault.
ACCOUNTING_GRACE_S = 300.0


class Waste(str, Enum):
    """Why a run's hours bought no result (``USEFUL``: they did)."""

    USEFUL = ""
    PREEMPTION = "preemption"
    NODE_FAILURE = "node_failure"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    NO_SPACE = "no_space"
    LOST = "lost"
    QUARANTINE = "quarantine"
    REPRODUCIBLE_FAILURE = "reproducible_failure"
    PRUNED = "pruned"
    RUN_AFTER_FINISH = "run_after_finish"  # a requeued run that found its trial finished: start-up, no work


WASTE_CAUSES = tuple(w for w in Waste if w is not Waste.USEFUL)  # the causes ``waste_hours`` totals, in this order
# The waste an interruption's cause means. A run's ending means what its SLURM state's cause means
# (``JobState.cause``, the one state table): BOOT_FAIL is a node failure, DEADLINE a time limit.
WASTE_OF_CAUSE = {
    Cause.NODE_FAIL: Waste.NODE_FAILURE,
    Cause.RANK_LOST: Waste.NODE_FAILURE,  # a rank's process or node gone: the gang's interruption
    Cause.PREEMPTED: Waste.PREEMPTION,
    Cause.TIMEOUT: Waste.TIMEOUT,
    Cause.CANCELLED: Waste.CANCELLED,
    Cause.CANCELLED_BY_OWNER: Waste.CANCELLED,
    Cause.NO_SPACE: Waste.NO_SPACE,
}


class FlagKind(str, Enum):
    """What an admin must look at in a reconciliation."""

    ORPHAN = "orphan"  # a job under the search's name the ledger does not know
    RUNNING_BUT_ENDED = "running_but_ended"  # the ledger believes an attempt runs; its run ended
    ATTEMPT_MISMATCH = "attempt_mismatch"  # sacct's runs that started and the ledger's attempts differ in number
    STATE_MISMATCH = "state_mismatch"  # the ledger's ending and the scheduler's state disagree
    UNKNOWN_TO_SCHEDULER = "unknown_to_scheduler"  # a job the ledger recorded that the scheduler has no accounting for
    STALE_HOLD = "stale_hold"  # a budget hold that does not charge what its attempt used: `sync` settles or restates it
    HOURS_MISMATCH = "hours_mismatch"  # the ledger's record of a run and sacct's differ
    RUN_AFTER_FINISH = "run_after_finish"  # the scheduler ran a trial's job again after the trial finished (overhead)


def report_row(line: object) -> dict:
    """A report line's fields (flat values: ``asdict``'s deep copy costs seconds on a million-line
    dump), Enums as their text."""
    cls: type = type(line)
    return {name: v.value if isinstance(v := getattr(line, name), Enum) else v for name in field_names(cls)}


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
    waste: Waste  # why these hours bought no result (USEFUL: they did)
    partition: str = ""
    user: str = ""  # who submitted the job (sacct's User; the launch's user on the local executor)
    account: str = ""  # the SLURM account it was charged to ("" on the local executor)
    # What the matched attempt's worker read of its GPUs (worker/devices.py); used = the scheduler's
    # allocated GPU-hours x that utilization, idle the rest (None: no reading, neither used nor idle).
    device: str = ""
    gpu_utilization: float | None = None
    gpu_hours_used: float | None = None
    gpu_hours_idle: float | None = None


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
    kind: FlagKind
    trial_id: str
    job_id: str
    detail: str


ORPHAN = {"kind": FlagKind.ORPHAN.value, "trial_id": ""}  # what every orphan's flag says besides its job and detail


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
    scheduler: Mapping[str, Mapping[str, float]]  # the scheduler's hours per ceiling: used, cap, left
    spend: Spend  # the search's one spend (ledger and budget journal); ``scheduler`` reconciles against it
    counts: Mapping[str, int] = field(default_factory=dict)
    pending: tuple[Pending, ...] = ()
    # The lines of the jobs the ledger does not know (orphans, slots that took no trial) and one
    # flag per orphan, as columns (columns.LINE_SCHEMA, columns.FLAG_SCHEMA): they may be a month's.
    other_lines: pa.Table = field(default_factory=columns.LINE_SCHEMA.empty_table)
    orphans: pa.Table = field(default_factory=columns.FLAG_SCHEMA.empty_table)
    unrecorded: tuple[tuple[str, int], ...] = ()  # (job, run) sacct filed and the ledger has not recorded: settled here, provisional elsewhere
    search_path: str = "SEARCH_DIR"  # where the search lives (the fixes the report names)
    ranks: tuple[RankLine, ...] = ()  # a gang's runs, per rank (``accounting/ranks.py``); none for trials of one rank
    steps: tuple[StepLine, ...] = ()  # a gang's srun steps as the scheduler measured their tasks (none where it measures none)

    @property
    def complete(self) -> bool:
        """Every job of the search is filed in full: the figures are final."""
        return not self.pending

    @property
    def flag_count(self) -> int:
        return len(self.flags) + self.orphans.num_rows

    def all_flags(self, limit: int | None = None) -> Iterator[Flag]:
        """The ledger's flags, then the orphans' (the first ``limit`` in all)."""
        orphans = self.orphans.slice(0, None if limit is None else max(0, limit - len(self.flags))).to_pylist()
        return islice((*self.flags, *(Flag(FlagKind.ORPHAN, "", o["job_id"], o["detail"]) for o in orphans)), limit)

    def lines(self) -> pa.Table:
        """Every line, the ledger's jobs' first, as columns (columns.LINE_SCHEMA)."""
        mine = pa.Table.from_pylist([report_row(a) for a in self.attempts], schema=columns.LINE_SCHEMA)
        return pa.concat_tables([mine, self.other_lines]) if self.other_lines.num_rows else mine

    def json_chunks(self) -> Iterator[columns.Text]:
        """The report as one JSON object, written a slice of lines at a time."""
        head = {
            "campaign": self.campaign,
            "complete": self.complete,
            "pending": [report_row(p) for p in self.pending],
            "objective": self.objective,
            "source": self.source,
            "counts": dict(self.counts),
            "figures": dict(self.figures),
            "spend": self.spend.to_json(),
            "unrecorded": [{"job_id": job, "run": run} for job, run in self.unrecorded],
            "scheduler": {k: dict(v) for k, v in self.scheduler.items()},
            "waste_hours": dict(self.waste_hours),
            "trials": [report_row(t) for t in self.trials],
            "ranks": [report_row(r) for r in self.ranks],
            "steps": [report_row(s) for s in self.steps],
        }
        yield json.dumps(head)[:-1].encode() + b',"flags":'
        yield from columns.json_array([columns.json_list_items([report_row(f) for f in self.flags]), *columns.json_items(self.orphans, ORPHAN)])
        yield b',"attempts":'
        yield from columns.json_array(columns.json_items(self.lines()))
        yield b"}"


def reconcile(
    campaign: str,
    objective: str,
    source: str,
    records: Sequence[TrialRecord],
    runs: Sequence[JobRun],
    listed: pa.Table | Sequence[JobRun],
    caps: BudgetCaps,
    journal: JournalView | None = None,
    selection_jobs: Sequence[JobHours] = (),
    now: float | None = None,
    search_path: str = "SEARCH_DIR",
    slot_jobs: Collection[str] = (),
) -> Reconciliation:
    """``runs``: the scheduler's runs of every job the ledger recorded; ``listed``: the runs
    (``runs.run_table`` columns, or records) of every job the scheduler holds under the search's name (orphans
    are those the ledger lacks);
    ``journal``: the search's budget journal (its spend, and the holds ended attempts left);
    ``selection_jobs``: what the selection's jobs ran (their part of the spend); ``slot_jobs``: the
    search's slots (``slots/``), so a slot that ended having taken no trial is a line, never an orphan.

    A job the scheduler has not filed in full (still active, or its record missing or short within
    ``ACCOUNTING_GRACE_S`` of the ledger's last word on it, by ``now``) is pending, never a flag.
    A run of a SLURM trial's job that sacct filed and the ledger has not recorded is settled here,
    in memory (``unrecorded``); one it recorded is compared with sacct's record."""
    by_job = runs_by_job(runs)
    flags: list[Flag] = _recorded_runs(records, by_job)
    records, unrecorded = _settled(records, by_job)
    by_trial = {r.trial_id: r for r in records}
    owners: dict[str, list[str]] = {}
    for r in records:
        for job in dict.fromkeys(r.jobs):
            owners.setdefault(job, []).append(r.trial_id)
    lines: list[AttemptLine] = []
    pending: list[Pending] = []

    for job, job_runs in by_job.items():
        if len(owners.get(job, ())) > 1:
            _packed_job(job, job_runs, [by_trial[t] for t in owners[job]], caps, now, lines, flags, pending)
            continue
        tid = owners.get(job, [""])[0]
        rec = by_trial.get(tid)
        ledger_attempts = [a for a in rec.attempts if a.job_id == job and a.started is not None] if rec else []
        after = _runs_after_finish(rec, ledger_attempts, job_runs) if rec is not None else ()
        started_runs = [a for a in job_runs if a.start is not None and a not in after]
        if after:
            flags.append(Flag(FlagKind.RUN_AFTER_FINISH, tid, job, _after_finish_detail(after)))
        lag = _filing_lag(job, job_runs, started_runs, ledger_attempts, now) if rec is not None else ""
        if lag:
            pending.append(Pending(tid, job, lag))
        if rec is not None and len(started_runs) != len(ledger_attempts) and not lag.startswith(_COUNT_LAG):
            flags.append(
                Flag(FlagKind.ATTEMPT_MISMATCH, tid, job, f"sacct shows {len(started_runs)} runs that started, the ledger {len(ledger_attempts)} attempts")
            )
        matched = dict(zip((a.attempt for a in started_runs), ledger_attempts))
        for a in job_runs:
            led = matched.get(a.attempt)
            if led is not None and (flag := _running_but_ended(tid, led, a)):
                flags.append(flag)
            if led is not None and led.how is not None:
                problem = _state_mismatch(led.how, a.state)
                if problem:
                    flags.append(Flag(FlagKind.STATE_MISMATCH, tid, job, problem))
            how = led.how.value if led is not None and led.how is not None else ""
            lines.append(_line(tid, a, led, how, Waste.RUN_AFTER_FINISH if a in after else _waste(rec, led, a), caps))

    # The jobs the ledger does not know: a slot that took no trial is a line (its start-up), the
    # rest are orphans, a line per run and a flag per job.
    listed = listed if isinstance(listed, pa.Table) else runs_table(listed)
    others = columns.other_lines(listed, owners.keys() | by_job.keys(), caps.rates)
    orphans = columns.orphan_flags(others, slot_jobs)
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
                flags.append(Flag(FlagKind.UNKNOWN_TO_SCHEDULER, r.trial_id, job, "the ledger recorded this job but the scheduler has no accounting for it"))

    by_trial_lines: dict[str, list[AttemptLine]] = {}
    for line in lines:
        by_trial_lines.setdefault(line.trial_id, []).append(line)
    trials = tuple(_trial_line(r, by_trial_lines.get(r.trial_id, [])) for r in records)  # grouped once: linear in the lines
    other = columns.totals(others)
    total_gpu = sum(l.gpu_hours for l in lines) + other["gpu_hours"]
    total_cpu = sum(l.cpu_hours for l in lines) + other["cpu_hours"]
    waste = {c.value: 0.0 for c in WASTE_CAUSES}
    for l in lines:
        if l.waste is not Waste.USEFUL:
            waste[l.waste.value] += l.gpu_hours if l.gpus else l.cpu_hours
    counts = counts_by_state(records)
    figures = _figures(lines, trials, total_gpu, total_cpu, caps)
    spend = search_spend(records, journal, selection_jobs, caps.rates)
    scheduler = {
        # ``spend``: the same hours as the ledger and the journal count them (selection jobs included)
        "gpu_hours": {"used": total_gpu, "cap": caps.gpu_hours_cap, "left": caps.gpu_hours_cap - total_gpu, "spend": spend.total.gpu_hours},
        "cost": {"used": caps.rates.cost(total_gpu, total_cpu), "cap": caps.cost_cap, "left": caps.cost_cap - caps.rates.cost(total_gpu, total_cpu)},
        "trials": {"used": float(len(records)), "cap": float(caps.max_trials), "left": float(caps.max_trials - len(records))},
    }
    if journal is not None:
        flags.extend(_stale_hold(h, search_path) for h in stale_holds(records, journal.holds))
    return Reconciliation(
        campaign,
        objective,
        source,
        tuple(lines),
        trials,
        tuple(flags),
        waste,
        figures,
        scheduler,
        spend,
        counts,
        tuple(pending),
        others,
        orphans,
        tuple(unrecorded),
        search_path,
    )


def _settled(records: Sequence[TrialRecord], by_job: Mapping[str, Sequence[JobRun]]) -> tuple[list[TrialRecord], list[tuple[str, int]]]:
    """The records of trials whose scheduler files runs with every run it filed that they have not recorded, settled in
    memory (pure); and those runs (job, run)."""
    out: list[TrialRecord] = []
    unrecorded: dict[tuple[str, int], None] = {}
    for r in records:
        if not backend_of(r.executor).files_runs:
            out.append(r)
            continue
        held = {a.key for a in r.accounted}
        new = [filed for job in r.jobs for run in by_job.get(job, ()) if (filed := run.accounted()) is not None and filed.key not in held]
        out.append(r.with_runs(new) if new else r)
        unrecorded.update((f.key, None) for f in new)
    return out, list(unrecorded)


_RECORD_FIELDS = ("start", "end", "elapsed_s", "gpus", "cpus")  # what a run's hours and its lost attempts' end depend on


def _recorded_runs(records: Sequence[TrialRecord], by_job: Mapping[str, Sequence[JobRun]]) -> list[Flag]:
    """A flag for every run of the ledger's jobs whose hours the ledger counts otherwise than sacct
    (pure): a recorded run sacct's record now contradicts (other times or hours, or no such run
    filed), and a run allocated more GPUs than the search asked for (the spend counts the request:
    ``budget.counted_gpus``)."""
    sharers: dict[str, list[str]] = {}
    asked: dict[str, int] = {}
    recorded: dict[tuple[str, int], Accounted] = {}
    for r in records:
        for job in dict.fromkeys(r.jobs):
            sharers.setdefault(job, []).append(r.trial_id)
            asked.setdefault(job, r.spec.shape.gpus)
        for run in r.accounted:
            recorded.setdefault(run.key, run)
    flags = []
    for job, runs in by_job.items():
        who, requested = ",".join(sharers.get(job, ())), asked.get(job)
        filed = {a.attempt: f for a in runs if (f := a.accounted()) is not None}
        for k, run in sorted((k, run) for (j, k), run in recorded.items() if j == job):
            ours = _hours(run_hours(run, requested or 0))
            theirs = filed.get(k)
            if theirs is None:
                flags.append(Flag(FlagKind.HOURS_MISMATCH, who, job, f"the ledger recorded run {k} ({ours}); sacct has filed no run {k} of this job"))
            elif any(getattr(theirs, f) != getattr(run, f) for f in _RECORD_FIELDS):
                flags.append(
                    Flag(
                        FlagKind.HOURS_MISMATCH,
                        who,
                        job,
                        f"the ledger recorded run {k} as {ours}, from {run.start} to {run.end};"
                        f" sacct says {_hours(run_hours(theirs, theirs.gpus))}, from {theirs.start} to {theirs.end}",
                    )
                )
        for k, theirs in sorted(filed.items()):
            if requested is not None and theirs.gpus > requested:
                flags.append(
                    Flag(
                        FlagKind.HOURS_MISMATCH,
                        who,
                        job,
                        f"run {k} was allocated {theirs.gpus} GPUs where the search asked for {requested}: sacct charges"
                        f" {_hours(run_hours(theirs, theirs.gpus))}, the spend counts {_hours(run_hours(theirs, requested))}",
                    )
                )
    return flags


def _hours(h: Hours) -> str:
    return f"{shown(h.gpu_hours)} GPU-h, {shown(h.cpu_hours)} CPU-h"


def _stale_hold(h: StaleHold, search_path: str) -> Flag:
    if h.settled:
        detail = (
            f"attempt {h.key.attempt} is charged {_hours(h.charged)} to the caps; the scheduler's record of its run gives it {_hours(h.used)}:"
            f" `parcel-hpc sync {search_path}` restates it"
        )
    else:
        detail = (
            f"attempt {h.key.attempt} ended but its budget hold of {_hours(h.charged)} is not settled:"
            f" it is charged to the cap until `parcel-hpc sync {search_path}` settles it"
        )
    return Flag(FlagKind.STALE_HOLD, h.key.trial_id, "", detail)


PACK_OVERHEAD = "start-up and gaps"  # ledger_how of the hours of a job run that no attempt of it ran in


def _packed_job(
    job: str,
    job_runs: Sequence[JobRun],
    recs: Sequence[TrialRecord],
    caps: BudgetCaps,
    now: float | None,
    lines: list[AttemptLine],
    flags: list[Flag],
    pending: list[Pending],
) -> None:
    """One job that ran several trials in turn: each run's attempts matched by restart count, its
    hours split among them (``_split``)."""
    pack = ",".join(r.trial_id for r in recs)
    by_run: dict[int, list[tuple[TrialRecord, Attempt]]] = {}
    for r in recs:
        for att in r.attempts:
            if att.job_id == job and att.started is not None:
                by_run.setdefault(att.restart_count, []).append((r, att))
    for ran in by_run.values():
        ran.sort(key=lambda item: cast(float, item[1].started))  # by_run holds started attempts only
    # A run that started once every trial of the pack had finished ran nothing: overhead, one flag.
    after = tuple(a for a in job_runs if a.start is not None and a.attempt not in by_run and all(_finished_by(r, cast(int, a.start)) for r in recs))
    if after:
        flags.append(Flag(FlagKind.RUN_AFTER_FINISH, pack, job, _after_finish_detail(after)))
    started_runs = [a for a in job_runs if a.start is not None and a not in after]
    firsts = [ran[0][1] for _, ran in sorted(by_run.items())]
    lag = _filing_lag(job, job_runs, started_runs, firsts, now)
    if lag:
        pending.append(Pending(pack, job, lag))
    # A requeued run that found every trial of its pack finished starts none, and says nothing: a run
    # sacct shows and the ledger lacks is a mismatch only when some trial still had work then.
    unfiled = sorted(set(by_run) - {a.attempt for a in started_runs})
    unheard = [a.attempt for a in started_runs if a.attempt not in by_run and any(_work_for(r, cast(int, a.start)) for r in recs)]  # started_runs: start is set
    if (unfiled or unheard) and not lag.startswith(_COUNT_LAG):
        flags.append(
            Flag(
                FlagKind.ATTEMPT_MISMATCH,
                pack,
                job,
                f"sacct shows {len(started_runs)} runs that started, the ledger heard from runs {sorted(by_run)} of this pack",
            )
        )
    for a in job_runs:
        ran = by_run.get(a.attempt, []) if a.start is not None else []
        for rec, led in ran:
            if flag := _running_but_ended(rec.trial_id, led, a):
                flags.append(flag)
            # No state_mismatch here: the job's state is the pack's (a pack goes on past a failed trial,
            # and may be signalled between two trials), each trial's own ending is the worker's word.
        _split(a, ran, caps, lines, Waste.RUN_AFTER_FINISH if a in after else Waste.USEFUL)


def _split(a: JobRun, ran: Sequence[tuple[TrialRecord, Attempt]], caps: BudgetCaps, lines: list[AttemptLine], rest_waste: Waste = Waste.USEFUL) -> None:
    """One run's lines, as the spend counts its hours: each attempt that ran in it its own (its
    start to its counted end: ``spend.attempt_hours``; one still running, to the run's end so far),
    and the rest (start-up, imports, a pack's gaps, the moments after the last trial) one line of
    the job itself (``rest_waste``: what its hours bought), so that the run's lines add up to sacct's hours."""
    run_end = a.end if a.end is not None else (a.start or 0) + a.elapsed_s  # sacct's elapsed so far, while it runs
    parts = Hours()
    seconds = 0
    for i, (rec, led) in enumerate(ran):
        assert led.started is not None and a.start is not None  # callers pass started attempts of a run that started
        end = led.counted_end()
        end = end if end is not None else max(led.started, run_end)
        hours = cast(Hours, attempt_hours(rec, led, until=end))  # the spend's figure, or to the run's end so far: never None with ``until``
        # Its times as the report shows them: whole seconds within the run (hosts' clocks may differ by a little).
        start_s = min(max(round(led.started), a.start), run_end)
        end_s = max(start_s, min(round(end), run_end))
        # Attempts before the last ended while the job went on: the job's state is the last one's.
        # Only the first waited in the queue; the others waited for their turn in the job.
        state = a.state if i == len(ran) - 1 else JobState.COMPLETED
        ended = a.end is not None or led.ended is not None
        part = replace(a, submit=a.submit if i == 0 else start_s, start=start_s, end=end_s if ended else None, elapsed_s=end_s - start_s, state=state)
        how = led.how.value if led.how is not None else ""
        lines.append(_line(rec.trial_id, part, led, how, _waste(rec, led, part), caps, hours))
        parts += hours
        seconds += end_s - start_s
    rest = Hours(a.gpu_hours, a.cpu_hours) - parts
    lines.append(_line("", replace(a, elapsed_s=max(0, a.elapsed_s - seconds)), None, PACK_OVERHEAD, rest_waste, caps, rest))


def _runs_after_finish(rec: TrialRecord, ledger_attempts: Sequence[Attempt], job_runs: Sequence[JobRun]) -> tuple[JobRun, ...]:
    """The runs of a trial's own job after the ledger's attempts, started once the trial had
    finished: the scheduler ran the job again with nothing left to do (Slurm 24.11 and 26.05 requeue a
    preempted job that completed inside its grace time, and file the run that did the work PREEMPTED). Pure."""
    later = [a for a in job_runs if a.start is not None and a.attempt >= len(ledger_attempts)]
    return tuple(a for a in later if _finished_by(rec, cast(int, a.start)))


def _after_finish_detail(after: Sequence[JobRun]) -> str:
    runs = ", ".join(str(a.attempt) for a in after)
    return (
        f"the scheduler ran this job again (run {runs}) after its trial had finished, with nothing left to do:"
        f" {_hours(Hours(sum(a.gpu_hours for a in after), sum(a.cpu_hours for a in after)))} of start-up,"
        " counted as run_after_finish (a requeue after completion, as Slurm 24.11 does after a preemption)"
    )


def _running_but_ended(trial_id: str, led: Attempt, a: JobRun) -> Flag | None:
    """The ledger still believes this attempt runs, while the scheduler says its run ended."""
    if led.how is None and a.state.is_terminal():
        return Flag(FlagKind.RUNNING_BUT_ENDED, trial_id, a.job_id, f"the ledger believes attempt {led.number} runs; the scheduler says {a.state.text}")
    return None


def _work_for(record: TrialRecord, t: float) -> bool:
    """Whether a requeued pack starting at ``t`` had this trial to run: not finished by then, and not
    left to run alone (``worker.task`` skips those)."""
    if _finished_by(record, t):
        return False
    return not (record.attempts and record.runs_alone())


def _finished_by(record: TrialRecord, t: float) -> bool:
    """The trial had finished, every attempt of it ended, by ``t``."""
    return record.state.is_finished() and all(a.ended is not None and a.ended <= t for a in record.attempts)


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
        if now - max(cast(int, a.start) for a in started_runs) < ACCOUNTING_GRACE_S:  # started_runs: start is set
            return f"{_COUNT_LAG}run {len(started_runs) - 1} started moments ago and its worker has not said so yet"
    active = [a for a in job_runs if a.state.is_active()]
    if active:
        return f"the scheduler still has job {job} {active[-1].state.text}: its hours are not final"
    return ""


def _line(tid: str, a: JobRun, led, how: str, waste: Waste, caps: BudgetCaps, hours: Hours | None = None) -> AttemptLine:
    """A report line of run ``a`` (or of its part ``hours``: an attempt's share, or the rest)."""
    hours = Hours(a.gpu_hours, a.cpu_hours) if hours is None else hours
    use = led.device_use if led is not None else None
    used, idle = GpuUse.of(hours.gpu_hours, use).columns()
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
        hours.gpu_hours,
        hours.cpu_hours,
        hours.cost(caps.rates),
        a.queue_wait_s,
        led.number if led is not None else None,
        how,
        waste,
        a.partition,
        a.user,
        a.account,
        ",".join(use.devices) if use is not None else "",
        use.utilization if use is not None else None,
        used,
        idle,
    )


def waste_of_state(state: JobState) -> Waste | None:
    """The waste a run's ending in ``state`` means by itself: its cause's, from the one state table
    (``JobState.cause``); None where the state says nothing of why."""
    cause = state.cause()
    return WASTE_OF_CAUSE.get(cause) if cause is not None else None


def _waste(rec: TrialRecord | None, led, a: JobRun) -> Waste:
    """Why this run's hours bought no result (USEFUL: they did). The scheduler's state says it first
    (what its cause means, by the one table), then the ledger's cause for the attempt."""
    if rec is None:
        return Waste.USEFUL
    if led is not None and (led.how is AttemptEnd.QUARANTINED or led.number <= rec.tainted_upto):
        return Waste.QUARANTINE
    if led is not None and _work_done_before_requeue(led.how, a.state):
        return Waste.USEFUL
    by_state = waste_of_state(a.state)
    if by_state is not None:
        return by_state
    if led is not None and led.cause in WASTE_OF_CAUSE:
        return WASTE_OF_CAUSE[led.cause]
    if led is not None and led.how is AttemptEnd.LOST:
        return Waste.LOST
    if rec.state is TrialState.FAILED:
        return Waste.REPRODUCIBLE_FAILURE
    if rec.state is TrialState.PRUNED:
        return Waste.PRUNED
    return Waste.USEFUL


def _work_done_before_requeue(how: AttemptEnd | None, state: JobState) -> bool:
    """The attempt finished its work and the scheduler filed its run PREEMPTED: the job was requeued
    after the work ended (Slurm 24.11 and 26.05 file a run that completed inside its preemption's grace
    time that way), so the run's hours bought the trial's result, and the two records do not disagree."""
    return state is JobState.PREEMPTED and how in _WORK_DONE


_WORK_DONE = (AttemptEnd.COMPLETED, AttemptEnd.PRUNED, AttemptEnd.REJECTED)


def _state_mismatch(how: AttemptEnd, state: JobState) -> str:
    if state.is_active() or _work_done_before_requeue(how, state):
        return ""
    if how in _WORK_DONE and state is not JobState.COMPLETED:
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
