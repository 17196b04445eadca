"""A table of many runs: ``JobRun``'s columns (``RUN_COLUMNS``, ``RUN_SCHEMA``), what admins' reports
aggregate without a Python object per row, and ``runs_table`` and ``job_runs`` between the records and
the table.

Apart from ``runs`` so that what reads no table (a trial's worker, the launch, most commands) loads
no pyarrow: a tenth of a second of every such process's start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pyarrow as pa

from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.states import JobState

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
