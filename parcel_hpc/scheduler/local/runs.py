"""The local executor's runs as the common record reconcile reads (sacct's shape): no scheduler keeps
one, so each is built from the ledger's own attempts (pure). Must not: read anything but records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from parcel_hpc.ledger import Attempt, AttemptEnd, TrialRecord
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.states import JobState


def local_runs(records: Iterable[TrialRecord], user: str = "") -> list[JobRun]:
    """The local executor's own record of each attempt, as job runs in sacct's shape (no scheduler to
    ask), with the GPUs it really handed out (none on a machine without them). A packed job (one
    process, several trials in turn) is one run from its first start to its last end."""
    records = list(records)
    sharers = Counter(job for r in records for job in dict.fromkeys(r.jobs))  # a pack: one job submitted for several trials, as reconcile reads it
    out: list[JobRun] = []
    packs: dict[str, tuple[int, int, list]] = {}
    for r in records:
        gpus, cpus = r.spec.shape.gpus, r.spec.shape.cpus
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
