"""The common record of a run: what every backend's accounting produces and reconcile reads.

Owns: the ``JobRun`` record (one run, or one wait, of one job id), ``StepUsage`` (one step of a
run) and ``runs_by_job``; a table of many runs is ``run_table``'s. The shape is sacct's
(one row per allocation of ``sacct --duplicates``, its states ``states.JobState``), because admins
read sacct's numbers beside the toolkit's: a backend without sacct maps its runs to it (the local
executor's, ``local/runs.py``). Must not: read a scheduler, price hours, or know trials.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from parcel_hpc.ledger.events import Accounted
from parcel_hpc.scheduler.states import JobState

SECONDS_PER_HOUR = 3600.0
_JOB_ID = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?$")

__all__ = ["JobRun", "StepUsage", "check_times", "runs_by_job"]


@dataclasses.dataclass(frozen=True)
class JobRun:
    """One run (or one wait) of one job id, as its scheduler accounted it."""

    job_id: str  # as submitted: "12", "29_3"
    raw_job_id: int  # the scheduler's own id of the run (sacct's JobIDRaw)
    base_job_id: int  # 29 for "29_3"
    array_task: int | None  # 3 for "29_3"
    attempt: int  # 0 for the first run of this job id, 1 after the first requeue ...
    state: JobState
    exit_status: int  # ExitCode before the colon (modulo 128 above 128 on 22.05)
    exit_signal: int  # ExitCode after the colon
    node_list: str  # "n1", "n[1-3]", "None assigned"
    partition: str
    account: str
    submit: int | None  # epoch seconds
    start: int | None  # epoch seconds; None: never started
    end: int | None  # epoch seconds; None: not ended yet
    elapsed_s: int  # seconds (sacct's ElapsedRaw)
    gpus: int  # gres/gpu in AllocTRES
    cpus: int  # cpu in AllocTRES
    line: int  # 1-based line of the allocation row in the scheduler's text
    user: str = ""  # who submitted it (sacct's User)

    def __post_init__(self) -> None:
        if not _JOB_ID.match(self.job_id):
            raise ValueError(f"JobRun.job_id {self.job_id!r} is not a job id without a step")
        if not isinstance(self.state, JobState):
            raise TypeError(f"JobRun.state must be a JobState, got {self.state!r}")
        for name in ("raw_job_id", "base_job_id", "attempt", "elapsed_s", "gpus", "cpus", "exit_status", "exit_signal"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"JobRun.{name} must be a non-negative int, got {value!r}")
        if self.line < 1:
            raise ValueError(f"JobRun.line must be >= 1, got {self.line}")
        check_times(self.submit, self.start, self.end, where=f"job {self.job_id}")

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / SECONDS_PER_HOUR

    @property
    def cpu_hours(self) -> float:
        return self.cpus * self.elapsed_s / SECONDS_PER_HOUR

    def accounted(self) -> Accounted | None:
        """This run as the ledger records it (``Accounted``), once the scheduler filed it in full: it
        started, it ended, its state is final and its allocation is known (slurmdbd can list a
        finished job a moment before its AllocTRES: every run holds a CPU). None before."""
        if self.start is None or self.end is None or self.state.is_active() or self.cpus == 0:
            return None
        return Accounted(self.job_id, self.attempt, self.start, self.end, min(self.elapsed_s, self.end - self.start), self.gpus, self.cpus, self.node_list)

    @property
    def queue_wait_s(self) -> int | None:
        """Submit to Start of this run (SLURM resets Submit on a requeue); None if it never started."""
        if self.start is None or self.submit is None:
            return None
        return self.start - self.submit


def check_times(submit: int | None, start: int | None, end: int | None, *, where: str) -> None:
    """ValueError naming ``where`` when a run's times are impossible (Start before Submit, End before Start)."""
    if start is not None and submit is not None and start < submit:
        raise ValueError(f"{where}: Start ({start}) is before Submit ({submit})")
    if end is not None and start is not None and end < start:
        raise ValueError(f"{where}: End ({end}) is before Start ({start})")


def runs_by_job(runs: Iterable[JobRun]) -> dict[str, list[JobRun]]:
    """Each job id's runs in the order its scheduler ran them (a requeued job has several)."""
    by_job: dict[str, list[JobRun]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    for rows in by_job.values():
        rows.sort(key=lambda r: r.attempt)
    return by_job


@dataclasses.dataclass(frozen=True)
class StepUsage:
    """One step of a job's run (a gang's srun, its ranks the step's tasks) as its scheduler measured
    what the tasks used: totals over every task, and the busiest task's. None: not measured."""

    job_id: str  # as submitted: "12", "29_3"
    step: str  # "0", "1" ... within its run
    start: int  # epoch seconds: which run of the job it belongs to
    nodes: int
    tasks: int
    node_list: str
    elapsed_s: int
    cpu_s: float | None  # user + system CPU time of every task (sacct's TotalCPU)
    memory_bytes: int | None  # the tasks' memory, summed (TRESUsageInTot mem)
    busiest_task: int | None  # the task (a gang's rank) that used the most CPU time ...
    busiest_node: str  # ... the node it ran on ...
    busiest_cpu_s: float | None  # ... and its CPU time (sampled: coarser than cpu_s)

    def ran_in(self, job_id: str, start: int | None, end: int | None) -> bool:
        """It ran within that run of the job (a requeued job's steps restart their numbers in each run)."""
        return job_id == self.job_id and start is not None and start <= self.start and (end is None or self.start <= end)
