"""Figures over trial records shared by status, the launch summary and the release packet (the
search's spend is ``accounting.spend``'s)."""

from __future__ import annotations

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
