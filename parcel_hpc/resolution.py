"""Attempts whose job vanished: how the scheduler says they ended.

A trial the ledger believes running whose job the scheduler no longer holds is resolved here, and
only here: ``resolve`` is the pure decision (records + scheduler facts -> resolutions), ``observe``
asks the scheduler, ``record`` journals the answer. The writers that own a search (the launch's
follower, ``resubmit``, ``sync``) record resolutions; ``status`` folds the same resolutions in memory
and shows them as not yet recorded, because a read command never writes.

A job is gone when the scheduler definitely says so: for SLURM, absent from squeue (sacct then
names the cause when it has the job's final record); locally, the worker's process is gone from
this host (another host's process cannot be seen, so it is never resolved from here).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from . import slurm
from .accounting import JobRun, JobState, build_sacct_argv, job_runs, parse_sacct, run_sacct
from .dispatch import local_job_alive
from .errors import SchedulerUnavailable
from .ledger import AttemptEnd, Cause, Ended, Executor, SearchDir, TrialRecord, TrialState

_CAUSE = {
    JobState.NODE_FAIL: Cause.NODE_FAIL,
    JobState.BOOT_FAIL: Cause.NODE_FAIL,
    JobState.PREEMPTED: Cause.PREEMPTED,
    JobState.TIMEOUT: Cause.TIMEOUT,
    JobState.DEADLINE: Cause.TIMEOUT,
    JobState.CANCELLED: Cause.CANCELLED,
    JobState.REVOKED: Cause.CANCELLED,
}


@dataclass(frozen=True)
class Resolution:
    trial_id: str
    attempt: int
    ending: Ended


@dataclass(frozen=True)
class SchedulerFacts:
    """What the scheduler said, once, for one decision."""

    host: str  # this host: local jobs are seen only here
    queued: Mapping[str, slurm.QueuedJob] = field(default_factory=dict)  # SLURM jobs still held
    local_alive: frozenset[str] = frozenset()  # pids alive on this host
    runs: Mapping[str, Sequence[JobRun]] = field(default_factory=dict)  # sacct runs per job id, in order
    slurm_error: str = ""  # squeue did not answer: no SLURM job is resolved

    def job_gone(self, record: TrialRecord) -> bool:
        job = record.jobs[-1]
        if record.executor is Executor.SLURM:
            return not self.slurm_error and job not in self.queued
        last = record.attempts[-1] if record.attempts else None
        if last is None:  # never started: the job is submitit's child of a launch on this host
            return job not in self.local_alive
        return last.host == self.host and job not in self.local_alive and str(last.pid) not in self.local_alive


def runs_by_job(runs: Iterable[JobRun]) -> dict[str, list[JobRun]]:
    """Each job id's runs in the order SLURM ran them (a requeued job has several)."""
    by_job: dict[str, list[JobRun]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    for rows in by_job.values():
        rows.sort(key=lambda r: r.attempt)
    return by_job


def interruption_cause(state: JobState) -> Cause:
    """The cause for how the scheduler says a run ended without a result."""
    return _CAUSE.get(state, Cause.LOST)


def ending_from_accounting(record: TrialRecord, job: str, runs: Sequence[JobRun]) -> Ended:
    """How the last attempt ended, from sacct's final record of its job (``lost`` without one)."""
    last = runs[-1] if runs else None
    if last is not None and last.state.is_active():
        last = None  # sacct still says running but the queue does not know it: the controller lost it
    message = f"resolved from the scheduler: {last.state.text if last is not None else 'gone from the queue'}"
    if last is not None and last.state is JobState.OUT_OF_MEMORY:
        return Ended(AttemptEnd.FAILED, Cause.OUT_OF_MEMORY, final=Cause.OUT_OF_MEMORY in record.failures, job_id=job, message=message)
    cause = interruption_cause(last.state) if last is not None else Cause.LOST
    return Ended(AttemptEnd.LOST if cause is Cause.LOST else AttemptEnd.INTERRUPTED, cause, job_id=job, message=message)


def needs_resolution(record: TrialRecord) -> bool:
    """The ledger says running, with an attempt that never said how it ended."""
    return record.state is TrialState.RUNNING and bool(record.jobs) and bool(record.attempts) and record.attempts[-1].how is None


def resolve(records: Iterable[TrialRecord], facts: SchedulerFacts) -> list[Resolution]:
    """The resolutions the scheduler's facts call for (pure)."""
    out = []
    for r in records:
        if needs_resolution(r) and facts.job_gone(r):
            job = r.jobs[-1]
            out.append(Resolution(r.trial_id, r.attempts[-1].number, ending_from_accounting(r, job, facts.runs.get(job, ()))))
    return out


# --- the edge: ask the scheduler, record the answer ----------------------------------------------


def observe(search: SearchDir, records: Sequence[TrialRecord], *, every_gone_job: bool = False) -> tuple[list[TrialRecord], SchedulerFacts]:
    """Ask the scheduler about ``records``' open jobs; the records read again afterwards, and the facts.

    sacct is asked about the jobs of attempts to resolve, or with ``every_gone_job`` about every open
    trial's job that left the queue (``resubmit`` reads node failures and causes from it).

    The queue is read before the records are read again: an attempt that said how it ended before
    its job left the queue is then seen as ended, never resolved as lost.
    """
    open_records = [r for r in records if not r.state.is_finished() and r.jobs]
    queued: dict[str, slurm.QueuedJob] = {}
    error = ""
    if any(r.executor is Executor.SLURM for r in open_records):
        try:
            for name in search.slurm_job_names():
                queued.update(slurm.queued_jobs(name))
        except SchedulerUnavailable as exc:
            error = str(exc)
    local_alive = frozenset(
        pid for r in open_records if r.executor is not Executor.SLURM for pid in (r.jobs[-1], *(str(a.pid) for a in r.attempts[-1:])) if local_job_alive(pid)
    )
    by_id = {r.trial_id: r for r in records}
    by_id.update((r.trial_id, search.record(r.trial_id)) for r in open_records)
    fresh = list(by_id.values())
    facts = SchedulerFacts(socket.gethostname(), queued, local_alive, slurm_error=error)
    gone_jobs = [
        r.jobs[-1]
        for r in fresh
        if r.executor is Executor.SLURM and not r.state.is_finished() and r.jobs and (every_gone_job or needs_resolution(r)) and facts.job_gone(r)
    ]
    if gone_jobs:
        facts = SchedulerFacts(facts.host, queued, local_alive, runs_by_job(job_runs(parse_sacct(run_sacct(build_sacct_argv(gone_jobs)), source="sacct"))))
    return fresh, facts


def record(search: SearchDir, resolutions: Iterable[Resolution], role: str) -> None:
    """Journal each resolution, as an owner of the search (never from a read command)."""
    for res in resolutions:
        search.writer(res.trial_id, role).resolved(res.attempt, res.ending)


def sync(search: SearchDir) -> list[Resolution]:
    """``parcel-hpc sync``: record every resolution, for a search whose launcher has gone."""
    search.contract()  # not a search directory: one line, exit 2
    records, facts = observe(search, list(search.records()))
    if facts.slurm_error:
        raise SchedulerUnavailable(facts.slurm_error)
    found = resolve(records, facts)
    record(search, found, "sync")
    return found
