"""Attempts that never said how they ended: how the scheduler (or the next attempt) says they did.

A trial whose last attempt has no ending while the run it ran in is over is resolved here, and only
here: ``resolve`` is the pure decision (records + scheduler facts + a policy -> resolutions),
``observe`` asks the scheduler, ``record`` journals the answer and settles the budget holds of the
attempts it ended (``lifecycle.settlement``). The writers that own a search record resolutions (the
launch's follower, ``resubmit``, ``sync``, ``cancel``, and a new attempt of the same trial, through
``lifecycle.actions.previous_attempt_ending``, which needs no scheduler, then settles its hold);
``status`` folds the same resolutions in memory and shows them as not yet recorded, because a read
command never writes.

An attempt's run is over when its job left the queue, or as soon as the scheduler requeued the job
after the attempt began (squeue's restart count passed the attempt's: a node failure, a preemption
without warning, an admin's requeue); its ending is read from sacct's record of that very run (the
attempt's ``restart_count``), never from the job's later runs. A job requeued that way reruns a
trial of its own, but a job that runs trials in turn (a pack, a slot) passes by a trial whose
attempt died unannounced (``TrialRecord.skipped_in_turn``): that trial waits for a job of its own
(``SchedulerFacts.runs_again``), which ``resubmit`` gives it at once. A cancelled trial's attempt
ended by the cancel is ``interrupted`` with its owner's cause, never a failure.

What counts as over, and what the scheduler's word is worth, depends on who asks (``Policy``):
- ``status`` and ``sync`` resolve a SLURM attempt only once sacct holds the record of its run, and
  a local job only when its worker's process is gone from this very host: the answer must be definite.
- ``resubmit`` resolves every attempt whose run is over, with sacct's cause when it has one.
- the launch's follower resolves the jobs its own dispatcher saw end, as ``lost``: it never waits
  on accounting (slurmdbd may lag or be down while trials run).

The scheduler's record of each run (sacct's start, end and hours, once filed in full) is recorded
here too (``record_filed_runs``; ``filed_runs`` is the pure part): it settles the hours of every
attempt that did not say how it ended at the run's end, and the run's start-up and gaps.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from parcel_hpc.errors import SchedulerUnavailable
from parcel_hpc.ledger import AttemptEnd, Cause, Ended, Executor, SearchDir, TrialRecord, TrialState, TrialWriter
from parcel_hpc.ledger.events import Accounted
from parcel_hpc.lifecycle import settlement
from parcel_hpc.scheduler.base import Backend, QueuedJob
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.scheduler.runs import JobRun


@dataclass(frozen=True)
class Policy:
    ask_accounting: bool  # ask sacct how vanished SLURM jobs ended
    require_final_record: bool  # resolve a SLURM attempt only once sacct has the record of its run


DEFINITE = Policy(ask_accounting=True, require_final_record=True)  # status, sync
RESUBMIT = Policy(ask_accounting=True, require_final_record=False)
FOLLOWER = Policy(ask_accounting=False, require_final_record=False)


@dataclass(frozen=True)
class Resolution:
    trial_id: str
    attempt: int
    ending: Ended


@dataclass(frozen=True)
class SchedulerFacts:
    """What the schedulers said, once, for one decision."""

    queued: Mapping[str, QueuedJob] = field(default_factory=dict)  # jobs still held (``Backend.held``: a local job another host runs counts)
    runs: Mapping[str, Sequence[JobRun]] = field(default_factory=dict)  # the scheduler's runs per job id, in order
    seen_ending: frozenset[str] = frozenset()  # jobs the caller's own dispatcher saw end
    queue_error: str = ""  # a scheduler did not answer: none of its jobs is resolved (``unread``)
    turn_jobs: frozenset[str] = frozenset()  # jobs that run trials in turn: packs (several trials list them) and slots
    unread: frozenset[Executor] = frozenset()  # the backends whose queue did not answer

    def job_gone(self, record: TrialRecord) -> bool:
        job = record.jobs[-1]
        return job in self.seen_ending or (backend_of(record.executor).executor not in self.unread and job not in self.queued)

    def requeued_since(self, record: TrialRecord) -> bool:
        """The scheduler requeued the trial's job after its last attempt began there: the run that
        attempt ran in has ended, though the job waits or runs again (squeue counts the restarts)."""
        last = record.attempts[-1] if record.attempts else None
        if last is None or last.started is None or last.job_id != record.jobs[-1]:
            return False
        queued = self.queued.get(last.job_id)
        return queued is not None and queued.restarts > last.restart_count

    def attempt_over(self, record: TrialRecord) -> bool:
        """The run the trial's last attempt ran in has ended: its job is gone, or requeued since."""
        return bool(record.jobs) and (self.job_gone(record) or self.requeued_since(record))

    def runs_again(self, record: TrialRecord) -> bool:
        """Its latest job, still held by the scheduler, runs the trial or will: a job of its own
        does, one that runs trials in turn passes it by once its attempt there died unannounced."""
        if not record.jobs or self.job_gone(record):
            return False
        return not (self.attempt_over(record) and record.jobs[-1] in self.turn_jobs and record.skipped_in_turn())


def attempt_run(record: TrialRecord, runs: Sequence[JobRun]) -> JobRun | None:
    """sacct's record of the run of its job the trial's last attempt ran in (the requeue count it
    started with), once that run is over; None while it runs or before sacct filed it."""
    number = record.attempts[-1].restart_count if record.attempts else 0
    own = [run for run in runs if run.attempt == number]
    return own[-1] if own and not own[-1].state.is_active() else None


def ending_from_accounting(record: TrialRecord, job: str, runs: Sequence[JobRun], requeued: bool = False) -> Ended:
    """How the last attempt ended, from sacct's record of its run (``lost`` without one).
    ``requeued``: its job is held again (``SchedulerFacts.requeued_since``): the attempt is ``lost``,
    so a job that runs trials in turn leaves it to a job of its own (``TrialRecord.runs_alone``)."""
    run = attempt_run(record, runs)
    if run is not None:
        said = run.state.text + (f" on {run.node_list}" if run.node_list and run.node_list != "None assigned" else "")
    else:
        said = "requeued by the scheduler" if requeued else "gone from the queue"
    message = f"resolved from the scheduler: {said}"
    cause = run.state.cause() if run is not None else None
    if record.state is TrialState.CANCELLED and cause in (None, Cause.CANCELLED):
        # The cancel's own scancel (or an end no record explains): its owner's cancel ended it.
        return Ended(AttemptEnd.INTERRUPTED, Cause.CANCELLED_BY_OWNER, job_id=job, message=f"{message}; its trial was cancelled by its owner")
    cause = cause or (Cause.REQUEUED_BY_SCHEDULER if requeued else Cause.LOST)
    if cause.is_training_failure():
        return Ended(AttemptEnd.FAILED, cause, final=cause in record.failures, job_id=job, message=message)
    if requeued:
        return Ended(AttemptEnd.LOST, cause, job_id=job, message=f"{message}; its job was requeued")
    return Ended(AttemptEnd.LOST if cause is Cause.LOST else AttemptEnd.INTERRUPTED, cause, job_id=job, message=message)


def needs_resolution(record: TrialRecord) -> bool:
    """A trial whose last attempt never said how it ended: an open one, or one finished meanwhile
    (a cancel ends a trial whose attempt its job then ended)."""
    return bool(record.jobs) and bool(record.attempts) and record.attempts[-1].how is None


def resolve(records: Iterable[TrialRecord], facts: SchedulerFacts, policy: Policy) -> list[Resolution]:
    """The resolutions the scheduler's facts call for under ``policy`` (pure)."""
    out = []
    for r in records:
        if not (needs_resolution(r) and facts.attempt_over(r)):
            continue
        job = r.jobs[-1]
        runs = facts.runs.get(job, ())
        if backend_of(r.executor).files_runs and policy.require_final_record and job not in facts.seen_ending and attempt_run(r, runs) is None:
            continue  # its run is over, but sacct has not filed how yet: no definite answer
        ending = ending_from_accounting(r, job, runs if policy.ask_accounting else (), requeued=not facts.job_gone(r))
        out.append(Resolution(r.trial_id, r.attempts[-1].number, ending))
    return out


def turn_jobs(records: Iterable[TrialRecord], slot_jobs: Iterable[str] = ()) -> frozenset[str]:
    """The jobs that run trials in turn: listed by more than one trial (a pack), or a slot's (pure)."""
    listed = Counter(job for r in records for job in dict.fromkeys(r.jobs))
    return frozenset(job for job, n in listed.items() if n > 1) | frozenset(j for j in slot_jobs if j)


# --- the edge: ask the scheduler, record the answer ----------------------------------------------


def observe(
    search: SearchDir, records: Sequence[TrialRecord], policy: Policy, *, every_gone_job: bool = False, seen_ending: Iterable[str] = ()
) -> tuple[list[TrialRecord], SchedulerFacts]:
    """Ask the scheduler about ``records``' open jobs; the records read again afterwards, and the facts.

    The queue is read before the records are read again: an attempt that said how it ended before
    its job left the queue is then seen as ended, never resolved as lost. sacct is asked (when the
    policy says so) about the jobs of attempts to resolve, or with ``every_gone_job`` about every
    open trial whose run is over (``resubmit`` reads node failures and causes from it).
    ``records``: every trial of the search where the caller has them (which jobs are packs).
    """
    open_records = [r for r in records if r.jobs and (not r.state.is_finished() or needs_resolution(r))]
    queued: dict[str, QueuedJob] = {}
    errors: dict[Executor, str] = {}
    for backend in dict.fromkeys(backend_of(r.executor) for r in open_records):
        try:
            queued.update(backend.held(search, [r for r in open_records if backend_of(r.executor) is backend]))
        except SchedulerUnavailable as exc:
            errors[backend.executor] = str(exc)
    by_id = {r.trial_id: r for r in records}
    by_id.update((r.trial_id, search.record(r.trial_id)) for r in open_records)
    fresh = list(by_id.values())
    turns = turn_jobs(records, (str(s.get("job_id", "")) for s in search.slot_records())) if open_records else frozenset()
    facts = SchedulerFacts(queued, seen_ending=frozenset(seen_ending), queue_error=next(iter(errors.values()), ""), turn_jobs=turns, unread=frozenset(errors))
    if policy.ask_accounting:
        asked = [
            r.jobs[-1]
            for r in fresh
            if backend_of(r.executor).files_runs
            and r.jobs
            and (needs_resolution(r) or (every_gone_job and not r.state.is_finished()))
            and facts.attempt_over(r)
        ]
        if asked:
            facts = replace(facts, runs=accounted_runs(fresh, asked))
    return fresh, facts


def accounted_runs(records: Iterable[TrialRecord], job_ids: Iterable[str]) -> dict[str, list[JobRun]]:
    """The scheduler's record of every run of these jobs of ``records`` (every requeued run), by job
    id, each asked of its own backend where that files runs."""
    wanted, kinds = set(job_ids), dict[Backend, set[str]]()
    for r in records:
        kinds.setdefault(backend_of(r.executor), set()).update(j for j in r.jobs if j in wanted)
    out: dict[str, list[JobRun]] = {}
    for backend, jobs in kinds.items():
        if jobs and backend.files_runs:
            out.update(backend.runs(sorted(jobs)))
    return out


def record(search: SearchDir, resolutions: Iterable[Resolution], writer: Callable[[str], TrialWriter]) -> list[settlement.StaleHold]:
    """Journal each resolution through the caller's writer for that trial (never from a read
    command), then settle the budget holds of the attempts it ended; the holds settled."""
    resolved = list(resolutions)
    for res in resolved:
        writer(res.trial_id).resolved(res.attempt, res.ending)
    if not resolved:
        return []
    return settlement.settle_ended(search, [search.record(tid) for tid in dict.fromkeys(res.trial_id for res in resolved)])


@dataclass(frozen=True)
class Synced:
    """What ``sync`` recorded."""

    resolutions: list[Resolution]
    runs: list[FiledRun]  # the scheduler's records of runs, newly recorded
    holds: list[settlement.StaleHold]  # budget holds settled or restated


def sync(search: SearchDir) -> Synced:
    """``parcel-hpc sync``: record every definite resolution, for a search whose launcher has gone,
    the scheduler's record of every run sacct has filed, and settle every hold left on an attempt
    that ended (a writer killed between the two, or an older parcel_hpc that never settled a
    ``lost``) or restate one the scheduler's record changed."""
    search.contract()  # not a search directory: one line, exit 2
    records, facts = observe(search, list(search.records()), DEFINITE)
    if facts.queue_error:
        raise SchedulerUnavailable(facts.queue_error)
    found = resolve(records, facts, DEFINITE)
    writers: dict[str, TrialWriter] = {}

    def writer(tid: str) -> TrialWriter:
        return writers.setdefault(tid, search.writer(tid, "sync"))

    record(search, found, writer)
    runs = record_filed_runs(list(search.records()), writer, every_job=True)
    return Synced(found, runs, settlement.settle_ended(search))


@dataclass(frozen=True)
class FiledRun:
    """A run sacct filed that a trial's ledger lacks (or holds as sacct filed it before)."""

    trial_id: str
    attempt: int  # the trial's attempt that ran in it, 0 for none
    run: Accounted


def filed_runs(records: Iterable[TrialRecord], runs: Mapping[str, Sequence[JobRun]]) -> list[FiledRun]:
    """The runs sacct filed (``runs``, per job id) that each trial of their job does not hold as filed
    (pure). Every trial a job was submitted for holds its runs: a pack's share them."""
    out = []
    for r in records:
        held = {a.key: a for a in r.accounted}
        for job in r.jobs:
            for run in runs.get(job, ()):
                filed = run.accounted()
                if filed is None or held.get(filed.key) == filed:
                    continue
                attempt = next((a.number for a in r.attempts if a.job_id == job and a.restart_count == filed.run and a.started is not None), 0)
                out.append(FiledRun(r.trial_id, attempt, filed))
    return out


def unfiled(records: Iterable[TrialRecord]) -> list[str]:
    """The jobs with a started attempt whose run the ledger holds no record of, where their scheduler
    files one (pure)."""
    jobs = {a.job_id for r in records if backend_of(r.executor).files_runs for a in r.attempts if a.job_id and a.started is not None and a.run is None}
    return sorted(jobs)


def record_filed_runs(records: Sequence[TrialRecord], writer: Callable[[str], TrialWriter], every_job: bool = False) -> list[FiledRun]:
    """Ask sacct about ``records``' jobs whose runs the ledger lacks (``every_job``: all their jobs),
    journal every run it filed through the caller's writer for each trial; what was recorded. The
    caller then settles or restates the holds those records change (``settlement.settle_ended``).
    A failing sacct raises (AccountingError)."""
    records = list(records)
    jobs = sorted({j for r in records if backend_of(r.executor).files_runs for j in r.jobs}) if every_job else unfiled(records)
    if not jobs:
        return []
    runs = accounted_runs(records, jobs)
    found = filed_runs(records, runs)
    for f in found:
        writer(f.trial_id).accounted(f.run, f.attempt)
    return found


def provisional_line(search: SearchDir, left: Sequence[str]) -> str:
    """What is said of the jobs whose runs sacct has not filed when a command stops waiting for it."""
    return f"sacct has not filed {len(left)} jobs' last runs yet: their hours stay provisional; `parcel-hpc sync {search.path}` records them later"


def record_runs_until(
    search: SearchDir, trial_ids: Sequence[str], writer: Callable[[str], TrialWriter], wait_s: float, read: Callable[[str], TrialRecord] | None = None
) -> list[str]:
    """Record the scheduler's record of the runs of ``trial_ids``' jobs that sacct has filed and the
    ledger lacks, and settle or restate the budget holds those records change; the jobs whose runs
    stay unfiled (their hours provisional). ``wait_s`` > 0: every job's runs, asked again each
    second until sacct has filed every run an attempt ran in, for up to ``wait_s``; 0: once, only
    the jobs with a run not recorded. ``read``: the caller's reader of a record. A failing sacct
    raises (AccountingError)."""
    read = read or search.record
    deadline = time.monotonic() + wait_s
    while True:
        found = record_filed_runs([read(tid) for tid in trial_ids], writer, every_job=wait_s > 0)
        if found:
            settlement.settle_ended(search, [search.record(tid) for tid in dict.fromkeys(f.trial_id for f in found)])
        left = unfiled([read(tid) for tid in trial_ids])
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(1.0)
