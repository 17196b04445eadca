"""Figures over trial records shared by status, the launch summary and (later) the release packet."""

from __future__ import annotations

import time
from collections.abc import Iterable

from parcel_hpc.ledger.records import TrialRecord
from parcel_hpc.ledger.states import TrialState


def counts_by_state(records: Iterable[TrialRecord]) -> dict[str, int]:
    return count_states(r.state for r in records)


def count_states(states: Iterable[TrialState]) -> dict[str, int]:
    """Every state's count, in the states' order, zeros included."""
    counts = {s.value: 0 for s in TrialState}
    for state in states:
        counts[state.value] += 1
    return counts


def best_completed(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The completed trial with the lowest miss-cost; quarantined results never count."""
    done = [r for r in records if r.state is TrialState.COMPLETED and r.metric is not None]
    return min(done, key=lambda r: (r.metric, r.trial_id)) if done else None


def compute_used(records: Iterable[TrialRecord], now: float | None = None) -> dict[str, float]:
    """Ledger view of compute: every attempt's start-to-end time times what it held (running ones to now):
    its CPUs, and the GPUs the scheduler allocated to it (none on a machine without them)."""
    now = time.time() if now is None else now
    gpu_h = cpu_h = 0.0
    attempts = 0
    for r in records:
        gpus, cpus = int(r.spec.resources.get("gpus", 0)), int(r.spec.resources.get("cpus", 1))
        for a in r.attempts:
            hours = a.hours(now)
            if hours is None:
                continue
            gpu_h += a.gpus_or(gpus) * hours  # GPU-hours only for GPUs the scheduler allocated
            cpu_h += cpus * hours
            attempts += 1
    return {"gpu_hours": gpu_h, "cpu_hours": cpu_h, "attempts": attempts}
