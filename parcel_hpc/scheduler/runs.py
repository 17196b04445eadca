"""The common record of a run: what every backend's accounting produces and reconcile reads.

Owns: the ``JobRun`` record (one run, or one wait, of one job id), its columns (``RUN_COLUMNS``,
``RUN_SCHEMA``: a table of many runs, what admins' reports aggregate without a Python object per
row), ``runs_table`` and ``job_runs`` between the two, and ``runs_by_job``. The shape is sacct's
(one row per allocation of ``sacct --duplicates``, its states ``states.JobState``), because admins
read sacct's numbers beside the toolkit's: a backend without sacct maps its runs to it (the local
executor's, ``local/runs.py``). Must not: read a scheduler, price hours, or know trials.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

import pyarrow as pa

from parcel_hpc.ledger.events import Accounted
from parcel_hpc.scheduler.states import JobState

SECONDS_PER_HOUR = 3600.0
_JOB_ID = re.compile(r"^\d+(?:_(?:\d+|\[[^\]]*\]))?(?:\+\d+)?$")
_TEXT = pa.string()

# A table of runs, grouped by job id, in run order (``job_runs`` reads it; a backend's parser builds it).
RUN_SCHEMA = pa.schema(
    [
        ("job_id", pa.string()),  # as submitted, without a step: 12, 29_3, 12+0, 29_[4-9]
        ("base_job_id", pa.int64()),  # 29 for 29_3
        ("array_task", pa.int64()),  # 3 for 29_3; null for plain jobs and pending array ranges
        ("raw_job_id", pa.int64()),  # the scheduler's own id of the run (sacct's JobIDRaw)
        ("attempt", pa.int32()),  # 0 for the first run of this job id, 1 after the first requeue ...
        ("is_last", pa.bool_()),  # the job id's last run
        ("state", pa.int8()),  # JobState.code
        ("state_text", _TEXT),  # as the scheduler printed it, e.g. "CANCELLED by 0"
        ("exit_status", pa.int16()),  # ExitCode before the colon
        ("exit_signal", pa.int16()),  # ExitCode after the colon
        ("job_name", _TEXT),
        ("node_list", _TEXT),
        ("partition", _TEXT),
        ("account", _TEXT),
        ("user", _TEXT),
        ("submit", pa.int64()),  # epoch seconds, null when unknown
        ("start", pa.int64()),  # epoch seconds, null: never started
        ("end", pa.int64()),  # epoch seconds, null: not ended yet
        ("elapsed_s", pa.int64()),  # seconds
        ("gpus", pa.int64()),  # GPUs allocated (sacct: gres/gpu in AllocTRES)
        ("cpus", pa.int64()),  # CPUs allocated
        ("billing", pa.int64()),  # the scheduler's billing units, 0 where it has none
        ("gpu_hours", pa.float64()),  # hours
        ("cpu_hours", pa.float64()),  # hours
        ("queue_wait_s", pa.int64()),  # seconds from submit to start, null if it never started
        ("line", pa.int64()),  # 1-based line of the run in the scheduler's text (a row number for a backend without one)
    ]
)
RUN_COLUMNS = tuple(RUN_SCHEMA.names)

__all__ = ["RUN_COLUMNS", "RUN_SCHEMA", "JobRun", "StepUsage", "check_times", "job_runs", "runs_by_job", "runs_table"]


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


def job_runs(table: pa.Table) -> list[JobRun]:
    """Every run of a ``RUN_SCHEMA`` table as a validated record, in the table's order."""
    cols = table.to_pydict()
    return [
        JobRun(
            job_id=cols["job_id"][i],
            raw_job_id=cols["raw_job_id"][i],
            base_job_id=cols["base_job_id"][i],
            array_task=cols["array_task"][i],
            attempt=cols["attempt"][i],
            state=JobState.from_code(cols["state"][i]),
            exit_status=cols["exit_status"][i],
            exit_signal=cols["exit_signal"][i],
            node_list=cols["node_list"][i],
            partition=cols["partition"][i],
            account=cols["account"][i],
            submit=cols["submit"][i],
            start=cols["start"][i],
            end=cols["end"][i],
            elapsed_s=cols["elapsed_s"][i],
            gpus=cols["gpus"][i],
            cpus=cols["cpus"][i],
            line=cols["line"][i],
            user=cols["user"][i],
        )
        for i in range(len(cols["job_id"]))
    ]


def runs_table(runs: Sequence[JobRun]) -> pa.Table:
    """Records as a ``RUN_SCHEMA`` table (a backend's own runs, a test's, or none)."""
    rows = [
        dataclasses.asdict(r)
        | {"state": r.state.code, "state_text": r.state.text, "job_name": "", "billing": 0, "is_last": True}
        | {"gpu_hours": r.gpu_hours, "cpu_hours": r.cpu_hours, "queue_wait_s": r.queue_wait_s}
        for r in runs
    ]
    return pa.Table.from_pylist(rows, schema=RUN_SCHEMA)


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
