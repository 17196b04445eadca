"""sacct's allocation rows as runs (the common ``scheduler.runs`` record): one per allocation row
of ``sacct --duplicates``, numbered within their job.

Owns: ``run_table``, sacct's parsed rows as a ``RUN_SCHEMA`` table, and ``totals_by_job``, the
per-job sums reconciliation reads. A requeued job (REQUEUED, PREEMPTED or NODE_FAIL rows, then its
final row) yields several runs of one job id; array tasks are jobs of their own ("29_3"), keyed by
the id as submitted, not by JobIDRaw (the array's last task carries the master's raw id). Must
not: read sacct, price hours, or know trials — mapping job ids to trials is the reconciler's job.

Run order within a job: Start, falling back to Submit when the run never started
(a PENDING row after a requeue), then source line. Everything stays columnar until
``job_runs`` materializes records, so a 1,000,000-line dump aggregates without a Python
object per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from parcel_hpc.errors import AccountingError
from parcel_hpc.scheduler.run_table import RUN_COLUMNS, RUN_SCHEMA, job_runs
from parcel_hpc.scheduler.runs import SECONDS_PER_HOUR, JobRun, check_times
from parcel_hpc.scheduler.slurm.sacct_parse import SacctTable

_ALLOCATION_COLUMNS = [c for c in RUN_COLUMNS if c not in ("attempt", "is_last", "gpu_hours", "cpu_hours", "queue_wait_s")]
_TOTALS_COLUMNS = ["job_id", "base_job_id", "array_task", "state", "exit_status", "submit", "start", "end", "elapsed_s", "gpus", "cpus", "line"]

__all__ = ["run_table", "sacct_runs", "totals_by_job"]


def run_table(sacct: SacctTable) -> pa.Table:
    """The allocation rows as runs (``RUN_COLUMNS``), grouped by job id, in run order.

    Raises AccountingError naming the line when an allocation row's times are impossible
    (Start before Submit, End before Start): billing an impossible run would be a guess.
    """
    t, attempt, is_last = _ordered_allocations(sacct, _ALLOCATION_COLUMNS)
    elapsed = t.column("elapsed_s")
    hours = pc.divide(pc.cast(elapsed, pa.float64()), SECONDS_PER_HOUR)
    columns = {name: t.column(name) for name in _ALLOCATION_COLUMNS}
    columns.update(
        attempt=pa.array(attempt.astype(np.int32)),
        is_last=pa.array(is_last),
        gpu_hours=pc.multiply(pc.cast(t.column("gpus"), pa.float64()), hours),
        cpu_hours=pc.multiply(pc.cast(t.column("cpus"), pa.float64()), hours),
        queue_wait_s=pc.subtract(t.column("start"), t.column("submit")),
    )
    return pa.table([columns[name] for name in RUN_COLUMNS], schema=RUN_SCHEMA)


def _ordered_allocations(sacct: SacctTable, columns: list[str]) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """Allocation rows (these columns) in run order, their run index within the job and is-last flag."""
    alloc = sacct.allocations(columns)
    n = alloc.num_rows
    submit = _np(alloc, "submit")
    start = _np(alloc, "start")
    end = _np(alloc, "end")
    line = alloc.column("line").to_numpy()
    _check_columns(submit, start, end, line, sacct.source)
    when = np.where(np.isnan(start), submit, start)
    when = np.where(np.isnan(when), -np.inf, when)  # never reported at all: keep source order first
    group_keys = _group_keys(alloc)
    sort_keys = (line, when, *group_keys)  # np.lexsort order: the last key is the primary one
    # sacct usually prints a job's runs together and in time order; then no sort or take is needed.
    order = None if _is_sorted(sort_keys) else np.lexsort(sort_keys)
    first = np.zeros(n, dtype=bool)  # the row starts a new job id
    first[:1] = True
    for key in group_keys:
        k = key if order is None else key[order]
        first[1:] |= k[1:] != k[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    is_last = np.ones(n, dtype=bool)
    is_last[:-1] = first[1:]
    t = alloc if order is None else alloc.take(pa.array(order))
    return t, np.arange(n) - group_start, is_last


def sacct_runs(sacct: SacctTable) -> list[JobRun]:
    """Every run of the dump as a validated record, grouped by job id in run order."""
    return job_runs(run_table(sacct))


def totals_by_job(source: SacctTable | pa.Table) -> pa.Table:
    """Per job id sums over its runs (stays columnar).

    ``source`` is a SacctTable (the fast path: only the columns the sums need are gathered) or
    ``run_table``'s output. Columns: job_id, base_job_id, array_task, attempts (the number of
    runs), final_state (JobState code of the last run), final_exit_status, gpu_hours, cpu_hours,
    elapsed_s, queue_wait_s (summed over runs that started), first_submit, last_end
    (None while the last run is still going).
    """
    if isinstance(source, SacctTable):
        table, attempt, is_last = _ordered_allocations(source, _TOTALS_COLUMNS)
    elif isinstance(source, pa.Table) and tuple(source.column_names) == RUN_COLUMNS:
        table = source
        attempt = table.column("attempt").to_numpy()
        is_last = table.column("is_last").to_numpy(zero_copy_only=False)
    else:
        raise TypeError("totals_by_job needs a SacctTable or run_table(...)'s output")
    n = table.num_rows
    starts = np.flatnonzero(attempt == 0)
    lasts = np.flatnonzero(is_last)
    elapsed = table.column("elapsed_s").to_numpy().astype(np.float64)
    submit, start, end = (_np(table, name) for name in ("submit", "start", "end"))
    wait = np.nan_to_num(start - submit, nan=0.0)

    def group_sum(values: np.ndarray, dtype: type) -> pa.Array:
        return pa.array(np.add.reduceat(values, starts).astype(dtype) if n else np.zeros(0, dtype))

    return pa.table(
        {
            "job_id": table.column("job_id").take(pa.array(starts)),
            "base_job_id": table.column("base_job_id").take(pa.array(starts)),
            "array_task": table.column("array_task").take(pa.array(starts)),
            "attempts": pa.array((lasts - starts + 1).astype(np.int32)),
            "final_state": table.column("state").take(pa.array(lasts)),
            "final_exit_status": table.column("exit_status").take(pa.array(lasts)),
            "gpu_hours": group_sum(table.column("gpus").to_numpy() * elapsed / SECONDS_PER_HOUR, np.float64),
            "cpu_hours": group_sum(table.column("cpus").to_numpy() * elapsed / SECONDS_PER_HOUR, np.float64),
            "elapsed_s": group_sum(elapsed, np.int64),
            "queue_wait_s": group_sum(wait, np.int64),
            "first_submit": _from_np(np.fmin.reduceat(submit, starts) if n else submit[:0]),
            "last_end": _from_np(end[lasts]),
        }
    )


def _group_keys(alloc: pa.Table) -> list[np.ndarray]:
    """Keys that together identify a job id, least significant first (np.lexsort order).

    (base id, array task) identifies it, except for heterogeneous components (12+0, 12+1) and
    pending array ranges (29_[4-9]); only when those occur is the job id text encoded too.
    """
    keys = [
        pc.fill_null(alloc.column("array_task"), -1).to_numpy(),
        alloc.column("base_job_id").to_numpy(),
    ]
    job_id = alloc.column("job_id")
    if alloc.num_rows and (pc.any(pc.match_substring(job_id, "+")).as_py() or pc.any(pc.match_substring(job_id, "[")).as_py()):
        codes = pc.dictionary_encode(job_id.combine_chunks()).indices.to_numpy(zero_copy_only=False)
        keys.insert(0, codes)
    return keys


def _is_sorted(keys: tuple[np.ndarray, ...]) -> bool:
    """Whether rows are already in lexicographic order of ``keys`` (np.lexsort order)."""
    if len(keys[0]) < 2:
        return True
    undecided = np.ones(len(keys[0]) - 1, dtype=bool)
    for key in reversed(keys):
        before, after = key[:-1], key[1:]
        if (undecided & (before > after)).any():
            return False
        undecided &= before == after
        if not undecided.any():
            return True
    return True


def _np(table: pa.Table, name: str) -> np.ndarray:
    """A nullable int64 column as float64 with NaN for null (exact below 2**53 s)."""
    return pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False)


def _from_np(values: np.ndarray) -> pa.Array:
    return pa.array(np.where(np.isnan(values), 0, values).astype(np.int64), mask=np.isnan(values))


def _check_columns(submit: np.ndarray, start: np.ndarray, end: np.ndarray, line: np.ndarray, source: str) -> None:
    with np.errstate(invalid="ignore"):
        bad = (start < submit) | (end < start)
    if bad.any():
        i = int(np.argmax(bad))
        as_int = [None if np.isnan(v) else int(v) for v in (submit[i], start[i], end[i])]
        try:
            check_times(*as_int, where=f"{source}:{int(line[i])}")
        except ValueError as exc:
            raise AccountingError(f"{exc}; the accounting record is inconsistent — ask the SLURM admin") from None
