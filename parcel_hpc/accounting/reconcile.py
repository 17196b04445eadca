"""Reconcile a search's ledger with the scheduler's accounting (pure).

Input: the trial records (what the ledger believes), the scheduler's runs of the ledger's jobs
(sacct rows, or the local executor's own records), the runs listed under the search's name (as
columns: an exported dump holds every orphan of a month), and the caps. Output: a
``Reconciliation`` with one line per job run and per trial, the flags an admin must look at, hours
wasted by cause, and the campaign figures. The ledger's jobs are matched run by run to its
attempts; the jobs it does not know stay columns (``columns.py``) into the printed report. No I/O
here; ``search_report.py`` asks sacct and writes reports.

Usage is the scheduler's: GPU-hours = AllocTRES gres/gpu x ElapsedRaw, per job run, to the second.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import cast

import pyarrow as pa

from parcel_hpc.accounting import columns
from parcel_hpc.accounting.spend import GpuUse, JobHours, Spend, search_spend
from parcel_hpc.budget import BudgetCaps, JournalView
from parcel_hpc.ledger import Attempt, AttemptEnd, Cause, TrialRecord, TrialState
from parcel_hpc.ledger.events import field_names
from parcel_hpc.ledger.summary import counts_by_state
from parcel_hpc.lifecycle.actions import runs_alone
from parcel_hpc.lifecycle.settlement import StaleHold, stale_holds
from parcel_hpc.scheduler.slurm.runs import JobRun, runs_by_job, runs_table
from parcel_hpc.scheduler.slurm.states import JobState

SECONDS_PER_HOUR = 3600.0
# slurmdbd files a job's last record a moment after the job ends (seconds, a minute when busy).
# Within this long of the ledger's last word on a job, a missing or short record is lag, not a fault.
ACCOUNTING_GRACE_S = 300.0
WASTE_CAUSES = ("preemption", "node_failure", "timeout", "cancelled", "no_space", "lost", "quarantine", "reproducible_failure", "pruned")


def report_row(line: object) -> dict:
    """A report line's fields (flat values: ``asdict``'s deep copy costs seconds on a million-line dump)."""
    cls: type = type(line)
    return {name: getattr(line, name) for name in field_names(cls)}


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
    kind: str  # orphan | running_but_ended | attempt_mismatch | state_mismatch | unknown_to_scheduler | stale_hold
    trial_id: str
    job_id: str
    detail: str


ORPHAN = {"kind": "orphan", "trial_id": ""}  # what every orphan's flag says besides its job and detail
STALE_HOLD = "stale_hold"  # a budget hold left on an attempt that ended: charged to the cap until settled


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
        return islice((*self.flags, *(Flag("orphan", "", o["job_id"], o["detail"]) for o in orphans)), limit)

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
            "scheduler": {k: dict(v) for k, v in self.scheduler.items()},
            "waste_hours": dict(self.waste_hours),
            "trials": [report_row(t) for t in self.trials],
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
    ``ACCOUNTING_GRACE_S`` of the ledger's last word on it, by ``now``) is pending, never a flag."""
    by_trial = {r.trial_id: r for r in records}
    owners: dict[str, list[str]] = {}
    for r in records:
        for job in dict.fromkeys(r.jobs):
            owners.setdefault(job, []).append(r.trial_id)
    by_job = runs_by_job(runs)
    flags: list[Flag] = []
    lines: list[AttemptLine] = []
    pending: list[Pending] = []

    for job, job_runs in by_job.items():
        if len(owners.get(job, ())) > 1:
            _packed_job(job, job_runs, [by_trial[t] for t in owners[job]], caps, now, lines, flags, pending)
            continue
        tid = owners.get(job, [""])[0]
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
            if led is not None and (flag := _running_but_ended(tid, led, a)):
                flags.append(flag)
            if led is not None and led.how is not None:
                problem = _state_mismatch(led.how, a.state)
                if problem:
                    flags.append(Flag("state_mismatch", tid, job, problem))
            lines.append(_line(tid, a, led, how, _waste(rec, led, a), caps))

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
                flags.append(Flag("unknown_to_scheduler", r.trial_id, job, "the ledger recorded this job but the scheduler has no accounting for it"))

    by_trial_lines: dict[str, list[AttemptLine]] = {}
    for line in lines:
        by_trial_lines.setdefault(line.trial_id, []).append(line)
    trials = tuple(_trial_line(r, by_trial_lines.get(r.trial_id, [])) for r in records)  # grouped once: linear in the lines
    other = columns.totals(others)
    total_gpu = sum(l.gpu_hours for l in lines) + other["gpu_hours"]
    total_cpu = sum(l.cpu_hours for l in lines) + other["cpu_hours"]
    waste = {c: 0.0 for c in WASTE_CAUSES}
    for l in lines:
        if l.waste:
            waste[l.waste] += l.gpu_hours if l.gpus else l.cpu_hours
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
        campaign, objective, source, tuple(lines), trials, tuple(flags), waste, figures, scheduler, spend, counts, tuple(pending), others, orphans
    )


def _stale_hold(h: StaleHold, search_path: str) -> Flag:
    return Flag(
        STALE_HOLD,
        h.key.trial_id,
        "",
        f"attempt {h.key.attempt} ended but its budget hold of {h.held_gpu_hours:.4f} GPU-h, {h.held_cpu_hours:.4f} CPU-h is not settled:"
        f" it is charged to the cap until `parcel-hpc sync {search_path}` settles it",
    )


PACK_OVERHEAD = "start-up and gaps"  # ledger_how of the hours of a pack or slot between its trials


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
    """One job that ran several trials in turn: each run's hours go to the attempts that ran in it
    (by the ledger's start and end of each, within the run), the rest (start-up, imports, the gaps
    between trials) to one line of the job itself, so the lines still add up to sacct's hours."""
    pack = ",".join(r.trial_id for r in recs)
    by_run: dict[int, list[tuple[TrialRecord, Attempt]]] = {}
    for r in recs:
        for att in r.attempts:
            if att.job_id == job and att.started is not None:
                by_run.setdefault(att.restart_count, []).append((r, att))
    for ran in by_run.values():
        ran.sort(key=lambda item: cast(float, item[1].started))  # by_run holds started attempts only
    started_runs = [a for a in job_runs if a.start is not None]
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
            Flag("attempt_mismatch", pack, job, f"sacct shows {len(started_runs)} runs that started, the ledger heard from runs {sorted(by_run)} of this pack")
        )
    for a in job_runs:
        ran = by_run.get(a.attempt, []) if a.start is not None else []
        used = 0
        run_end = a.end if a.end is not None else (a.start or 0) + a.elapsed_s  # sacct's elapsed so far, while it runs
        for i, (rec, led) in enumerate(ran):
            assert a.start is not None and led.started is not None  # ran is empty unless the run started; by_run holds started attempts only
            last = i == len(ran) - 1
            start = min(max(int(led.started), a.start), run_end)
            end = max(start, min(int(led.ended) if led.ended is not None else run_end, run_end))
            ended = a.end is not None or led.ended is not None
            # Attempts before the last ended while the job went on: the job's state is the last one's.
            # Only the first waited in the queue; the others waited for their turn in the job.
            state = a.state if last else JobState.COMPLETED
            part = replace(a, submit=a.submit if i == 0 else start, start=start, end=end if ended else None, elapsed_s=end - start, state=state)
            used += part.elapsed_s
            how = led.how.value if led.how is not None else ""
            if flag := _running_but_ended(rec.trial_id, led, a):
                flags.append(flag)
            # No state_mismatch here: the job's state is the pack's (a pack goes on past a failed trial,
            # and may be signalled between two trials), each trial's own ending is the worker's word.
            lines.append(_line(rec.trial_id, part, led, how, _waste(rec, led, part), caps))
        rest = replace(a, elapsed_s=max(0, a.elapsed_s - used))
        lines.append(_line("", rest, None, PACK_OVERHEAD, "", caps))


def _running_but_ended(trial_id: str, led: Attempt, a: JobRun) -> Flag | None:
    """The ledger still believes this attempt runs, while the scheduler says its run ended."""
    if led.how is None and a.state.is_terminal():
        return Flag("running_but_ended", trial_id, a.job_id, f"the ledger believes attempt {led.number} runs; the scheduler says {a.state.text}")
    return None


def _work_for(record: TrialRecord, t: float) -> bool:
    """Whether a requeued pack starting at ``t`` had this trial to run: not finished by then, and not
    left to run alone (``worker.task`` skips those)."""
    if record.state.is_finished() and all(a.ended is not None and a.ended <= t for a in record.attempts):
        return False
    return not (record.attempts and runs_alone(record))


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


def _line(tid: str, a: JobRun, led, how: str, waste: str, caps: BudgetCaps) -> AttemptLine:
    use = led.device_use if led is not None else None
    used, idle = GpuUse.of(a.gpu_hours, use).columns()
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
        a.partition,
        a.user,
        a.account,
        ",".join(use.devices) if use is not None else "",
        use.utilization if use is not None else None,
        used,
        idle,
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


def local_runs(records: Iterable[TrialRecord], user: str = "") -> list[JobRun]:
    """The local executor's own record of each attempt, as job runs in sacct's shape (no scheduler to
    ask), with the GPUs it really handed out (none on a machine without them). A packed job (one
    process, several trials in turn) is one run from its first start to its last end."""
    records = list(records)
    sharers = Counter(job for r in records for job in dict.fromkeys(r.jobs))  # a pack: one job submitted for several trials, as reconcile reads it
    out: list[JobRun] = []
    packs: dict[str, tuple[int, int, list]] = {}
    for r in records:
        gpus, cpus = int(r.spec.resources.get("gpus", 0)), int(r.spec.resources.get("cpus", 1))
        runs_of_job: dict[str, int] = {}
        for a in r.attempts:
            if a.started is None or not a.job_id:
                continue
            if sharers[a.job_id] > 1:
                packs.setdefault(a.job_id, (a.gpus_or(gpus), cpus, []))[2].append(a)
                continue
            run = runs_of_job.get(a.job_id, 0)
            runs_of_job[a.job_id] = run + 1
            out.append(_local_run(a.job_id, run, a, a.started, a.ended, a.gpus_or(gpus), cpus, len(out) + 1, user))
    for job, (gpus, cpus, attempts) in packs.items():
        attempts.sort(key=lambda a: a.started)
        ends = [a.ended for a in attempts]
        end = max(ends) if None not in ends else None
        out.append(_local_run(job, 0, attempts[-1], attempts[0].started, end, gpus, cpus, len(out) + 1, user))
    return out


def _local_run(job: str, run: int, last: Attempt, start: float, end: float | None, gpus: int, cpus: int, line: int, user: str) -> JobRun:
    state = _LOCAL_STATE.get(last.how, JobState.RUNNING) if last.how is not None and end is not None else JobState.RUNNING
    return JobRun(
        job_id=job,
        raw_job_id=int(job) if job.isdigit() else 0,
        base_job_id=int(job) if job.isdigit() else 0,
        array_task=None,
        attempt=run,
        state=state,
        exit_status=0,
        exit_signal=0,
        node_list=last.host,
        partition="local",
        account="",
        submit=int(start),
        start=int(start),
        end=int(end) if end is not None else None,
        elapsed_s=int(round((end if end is not None else start) - start)),
        gpus=gpus,
        cpus=cpus,
        line=line,
        user=user,
    )


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
