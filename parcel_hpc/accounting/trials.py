"""A search's trials as typed rows: one per trial (or per attempt), what it did and what it spent.

Hours are the search's spend (``accounting.spend``), attempt by attempt: each attempt's start to its
counted end (``Attempt.counted_end``: an attempt that did not say how it ended, to its run's end as
the scheduler recorded it), times the CPUs it held and the GPUs its scheduler allocated, and what
is still held; ``provisional`` says which hours end where the ledger noticed a loss, until the
scheduler's record of the run is recorded. Start-up, pack gaps and selection jobs are no trial's. What
``parcel-hpc export`` writes (CSV, Parquet, JSON lines) and what the MLflow export and the search
report read, so a trial's hours are counted once, the same everywhere. Must not: write anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from parcel_hpc.accounting.spend import GpuUse, attempt_spend
from parcel_hpc.budget import BudgetLedger, Hold, Rates, ReservationKey, search_caps
from parcel_hpc.ledger import AttemptEnd, Event, SearchDir, TrialRecord, TrialState
from parcel_hpc.ledger.events import Milestone
from parcel_hpc.ledger.records import counted_milestones
from parcel_hpc.ledger.summary import queue_waits

_TIME = pa.timestamp("ms", tz="UTC")

# What an attempt used of its GPUs (worker/devices.py), in jobstats' words: gpu_hours is what was allocated.
GPU_USE_COLUMNS = [
    ("device", pa.string()),  # what its (last) attempt ran on: GPU names, or "cpu"
    ("gpu_peak_memory_bytes", pa.int64()),  # torch.cuda.max_memory_allocated, the largest of its attempts'
    ("gpu_utilization", pa.float64()),  # mean busy fraction NVML read, a trial's weighted by GPU-hours (null: no reading)
    ("gpu_hours_used", pa.float64()),  # gpu_hours x utilization (null: an attempt with GPU-hours had no reading)
    ("gpu_hours_idle", pa.float64()),  # gpu_hours - gpu_hours_used
]

TRIAL_COLUMNS = [
    ("trial_id", pa.string()),
    ("index", pa.int64()),
    ("state", pa.string()),
    ("reason", pa.string()),
    ("final_metric", pa.float64()),  # a completed trial's validation miss-cost
    ("metric_resume", pa.string()),  # uninterrupted, exact (resumed bit-equal), or within_tolerance (train.resume_tolerance)
    ("best_metric", pa.float64()),  # the lowest miss-cost it reported at any milestone or at its end
    ("fold_metrics", pa.string()),  # a completed K-fold trial's miss-cost per fold, in fold order, space-separated (final_metric: their mean)
    ("fold_spread", pa.float64()),  # their sample standard deviation (null: a trial without folds)
    ("milestones_reached", pa.int64()),
    ("last_milestone", pa.float64()),  # the step of the last milestone reported (NaN: none)
    ("step", pa.int64()),
    ("attempts", pa.int64()),
    ("interrupted", pa.int64()),
    ("gpu_hours", pa.float64()),  # used by its attempts, as the search's spend counts them (accounting.spend)
    ("cpu_hours", pa.float64()),
    ("cost", pa.float64()),
    ("held_gpu_hours", pa.float64()),  # worst case still reserved for its attempts that have not settled
    ("held_cpu_hours", pa.float64()),
    ("provisional_gpu_hours", pa.float64()),  # of gpu_hours: ending where the ledger noticed a loss, until the scheduler's record of the run is recorded
    ("provisional_cpu_hours", pa.float64()),
    *GPU_USE_COLUMNS,
    ("queue_wait_s", pa.float64()),  # every attempt's wait from its job's submission (or requeue) to its start
    ("started_at", _TIME),
    ("ended_at", _TIME),
    ("executor", pa.string()),
    ("jobs", pa.string()),  # scheduler job ids, in order, space-separated
    ("seed", pa.int64()),
    ("config_hash", pa.string()),
    ("proposed_by", pa.string()),  # the sampler (lineage: the trial's spec)
    ("proposal", pa.int64()),  # a learning sampler's proposal number (null: drawn from seed and index)
    ("history_digest", pa.string()),  # what that proposal was told (parcel-hpc proposals --replay)
]

ATTEMPT_COLUMNS = [
    ("trial_id", pa.string()),
    ("attempt", pa.int64()),
    ("job_id", pa.string()),
    ("host", pa.string()),
    ("how", pa.string()),  # how it ended; empty while it runs
    ("cause", pa.string()),
    ("trial_state", pa.string()),
    ("metric", pa.float64()),  # its final metric when it completed the trial
    ("step", pa.int64()),
    ("resumed_from", pa.int64()),
    ("gpus", pa.int64()),
    ("cpus", pa.int64()),
    ("wall_s", pa.float64()),
    ("gpu_hours", pa.float64()),  # what it used: what it settled, or its start to end if it never reserved (null: runs)
    ("cpu_hours", pa.float64()),
    ("cost", pa.float64()),
    ("held_gpu_hours", pa.float64()),  # its worst case, still reserved: it has not settled
    ("held_cpu_hours", pa.float64()),
    ("provisional", pa.bool_()),  # its hours end where the ledger noticed its loss, until the scheduler's record of its run is recorded
    *GPU_USE_COLUMNS,
    ("queue_wait_s", pa.float64()),
    ("started_at", _TIME),
    ("ended_at", _TIME),
]


@dataclass(frozen=True)
class TrialRows:
    """One trial as read: its record, its events, its row and its attempts' rows."""

    record: TrialRecord
    events: Sequence[Event]
    row: dict[str, Any]  # TRIAL_COLUMNS
    attempts: list[dict[str, Any]]  # ATTEMPT_COLUMNS, one per attempt

    def milestones(self) -> list[tuple[float, Milestone]]:
        """(when, what) of every milestone its untainted attempts reported, in order."""
        return counted_milestones(self.record, self.events)


def trial_rows(search: SearchDir) -> Iterator[TrialRows]:
    """Every trial of the search, in trial order (reads only)."""
    rates = search_caps(search.contract()).rates
    journal = BudgetLedger.read(search.path)
    holds = journal.holds if journal is not None else {}
    for record, events in search.histories():
        lines = _attempt_rows(record, events, rates, holds)
        yield TrialRows(record, events, _trial_row(record, events, lines), lines)


def table(search: SearchDir, attempts: bool = False) -> pa.Table:
    """The search's rows as one typed table (reads only)."""
    rows: list[dict[str, Any]] = []
    params: list[dict[str, Any]] = []  # each row's trial parameters
    own: list[Mapping[str, float]] = []  # each trial row's trainer metrics at its last validated step
    for trial in trial_rows(search):
        new = trial.attempts if attempts else [trial.row]
        rows += new
        params += [dict(trial.record.spec.params)] * len(new)
        own += [] if attempts else [trial.record.train_metrics]
    columns = ATTEMPT_COLUMNS if attempts else TRIAL_COLUMNS
    data = {name: pa.array([r[name] for r in rows], type=kind) for name, kind in columns}
    # The parameters right after the identity columns; pyarrow infers each one's type (ints stay ints).
    names = [name for name, _ in columns]
    cut = names.index("attempt" if attempts else "trial_id") + 1
    ordered = {n: data[n] for n in names[:cut]}
    ordered.update({f"params_{p}": _param_column([row.get(p) for row in params]) for p in sorted({k for row in params for k in row})})
    ordered.update({n: data[n] for n in names[cut:]})
    # The trainer's own metrics (run.stepped's) last: the pinned metric above decides, these inform.
    ordered.update({f"train_{k}": pa.array([m.get(k) for m in own], pa.float64()) for k in sorted({k for m in own for k in m})})
    return pa.table(ordered)


def _utilization(attempts: Sequence[dict[str, Any]]) -> float | None:
    """The attempts' utilization weighted by their GPU-hours: a trial whose every attempt read one has
    gpu_hours_used = gpu_hours x it, as each attempt has."""
    read = [(r["gpu_utilization"], r["gpu_hours"] or 0.0) for r in attempts if r["gpu_utilization"] is not None]
    hours = sum(h for _, h in read)
    return sum(u * h for u, h in read) / hours if hours else None


def _all_read(values: list[float | None]) -> float | None:
    """The sum, or null where one attempt with GPU-hours had no utilization reading (0.0: none had GPU-hours)."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _param_column(values: list[Any]) -> pa.Array:
    """One parameter's column, typed as pyarrow infers it (ints stay ints, floats floats); a choice
    of mixed kinds (``[64, "auto"]``, ``[true, 0]``) or of lists is JSON text, one cell each."""
    try:
        column = pa.array(values)
        if not pa.types.is_nested(column.type):
            return column
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    return pa.array([None if v is None else json.dumps(v) for v in values], pa.string())


def _attempt_rows(record: TrialRecord, events: Sequence[Event], rates: Rates, holds: Mapping[ReservationKey, Hold]) -> list[dict[str, Any]]:
    gpus_asked, cpus = record.spec.shape.gpus, record.spec.shape.cpus
    rows = []
    for a, wait in zip(record.attempts, queue_waits(record, events)):
        end = a.counted_end()
        wall = (end - a.started) if a.started is not None and end is not None else None
        gpus = a.gpus_or(gpus_asked)
        spent = attempt_spend(record, a, holds)  # the search's spend counts it so: the columns add up to it
        used, held = spent.used, spent.held
        counted = end is not None or ReservationKey(record.trial_id, a.number) in holds  # else it runs, not yet reserved
        result = a.how is AttemptEnd.COMPLETED and record.state is TrialState.COMPLETED and a.number > record.tainted_upto
        use = a.device_use
        gpu_used, gpu_idle = GpuUse.of(used.gpu_hours, use).columns() if counted else (None, None)
        rows.append(
            {
                "trial_id": record.trial_id,
                "attempt": a.number,
                "job_id": a.job_id,
                "host": a.host,
                "how": a.how.value if a.how is not None else "",
                "cause": a.cause.value if a.cause is not None else "",
                "trial_state": record.state.value,
                "metric": record.metric if result else None,
                "step": a.step,
                "resumed_from": a.resumed_from,
                "gpus": gpus,
                "cpus": cpus,
                "wall_s": wall,
                "gpu_hours": used.gpu_hours if counted else None,
                "cpu_hours": used.cpu_hours if counted else None,
                "cost": used.cost(rates) if counted else None,
                "held_gpu_hours": held.gpu_hours,
                "held_cpu_hours": held.cpu_hours,
                "provisional": spent.provisional,
                "device": ",".join(use.devices) if use is not None else None,
                "gpu_peak_memory_bytes": use.peak_memory_bytes if use is not None else None,
                "gpu_utilization": use.utilization if use is not None else None,
                "gpu_hours_used": gpu_used,
                "gpu_hours_idle": gpu_idle,
                "queue_wait_s": wait,
                "started_at": _ms(a.started),
                "ended_at": _ms(end),  # where its hours end (Attempt.counted_end)
            }
        )
    return rows


def _trial_row(record: TrialRecord, events: Sequence[Event], attempts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    valid = [m for _, m in counted_milestones(record, events)]
    values = [m.value for m in valid] + ([record.metric] if record.metric is not None else [])
    reached = {m.step for m in valid if m.is_milestone}
    waits = [r["queue_wait_s"] for r in attempts if r["queue_wait_s"] is not None]
    started = [a.started for a in record.attempts if a.started is not None]
    return {
        "trial_id": record.trial_id,
        "index": record.spec.index,
        "state": record.state.value,
        "reason": record.reason,
        "final_metric": record.metric,
        "metric_resume": record.metric_resume.value,
        "best_metric": min(values) if values else None,
        "fold_metrics": " ".join(repr(v) for v in record.folds.values) if record.folds is not None else None,
        "fold_spread": record.folds.spread if record.folds is not None else None,
        "milestones_reached": len(reached),
        "last_milestone": record.milestone,
        "step": record.step,
        "attempts": len(record.attempts),
        "interrupted": record.interrupted,
        "gpu_hours": sum(r["gpu_hours"] or 0.0 for r in attempts),
        "cpu_hours": sum(r["cpu_hours"] or 0.0 for r in attempts),
        "cost": sum(r["cost"] or 0.0 for r in attempts),
        "held_gpu_hours": sum(r["held_gpu_hours"] for r in attempts),
        "held_cpu_hours": sum(r["held_cpu_hours"] for r in attempts),
        "provisional_gpu_hours": sum(r["gpu_hours"] or 0.0 for r in attempts if r["provisional"]),
        "provisional_cpu_hours": sum(r["cpu_hours"] or 0.0 for r in attempts if r["provisional"]),
        "device": next((r["device"] for r in reversed(attempts) if r["device"]), None),
        "gpu_peak_memory_bytes": max((r["gpu_peak_memory_bytes"] for r in attempts if r["gpu_peak_memory_bytes"] is not None), default=None),
        "gpu_utilization": _utilization(attempts),
        "gpu_hours_used": _all_read([r["gpu_hours_used"] for r in attempts if r["gpu_hours"]]),
        "gpu_hours_idle": _all_read([r["gpu_hours_idle"] for r in attempts if r["gpu_hours"]]),
        "queue_wait_s": sum(waits) if waits else None,
        "started_at": _ms(min(started)) if started else None,
        "ended_at": _ms(record.ended_at),
        "executor": str(record.executor or ""),
        "jobs": " ".join(record.jobs),
        "seed": record.spec.seed,
        "config_hash": record.spec.config_hash,
        "proposed_by": (record.spec.origin or {}).get("sampler", ""),
        "proposal": (record.spec.origin or {}).get("proposal"),
        "history_digest": (record.spec.origin or {}).get("history_digest", ""),
    }


def _ms(t: float | None) -> int | None:
    return None if t is None else int(round(t * 1000))
