"""Figures over trial records shared by status, the launch summary, the release packet, export
and the search report (the search's spend is ``accounting.spend``'s)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from parcel_hpc.ledger.events import Event, Submitted
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


def queue_waits(record: TrialRecord, events: Sequence[Event]) -> tuple[float | None, ...]:
    """Each attempt's wait in seconds, in ``record.attempts``' order, from its job's submission (or
    its requeue: the end of that job's previous run) to its start; None for one that has not
    started or whose submission was not recorded."""
    submitted = [(e.t, e.data.job_id) for e in events if isinstance(e.data, Submitted)]
    previous_end: dict[str, float] = {}  # job id -> when its last attempt ended (a requeue waits from there)
    waits: list[float | None] = []
    for a in record.attempts:
        wait = None
        if a.started is not None:
            marks = [t for t, job in submitted if job == a.job_id and t <= a.started]
            if a.job_id in previous_end:
                marks.append(previous_end[a.job_id])
            wait = a.started - max(marks) if marks else None
        if a.ended is not None and a.job_id:
            previous_end[a.job_id] = a.ended
        waits.append(wait)
    return tuple(waits)
