"""What the journals say of the order a slot took its trials: the longest expected first."""

from __future__ import annotations

from parcel_hpc.ledger import SearchDir, TrialRecord
from parcel_hpc.scheduler import slots


def taken_longest_first(search: SearchDir) -> tuple[list[str], bool]:
    """For a search run by one slot at a time: the trials it took while another still queued was
    expected to run longer (by the rule the slot applies, from the peers finished when it took it),
    and whether some trial was taken ahead of an earlier-numbered one."""
    limit_s = 60.0 * float(search.contract()["resources"]["time_limit_min"])  # a trial's limit, as the slot reads it
    records: list[TrialRecord] = sorted(search.records(), key=lambda r: r.attempts[0].started or 0.0)
    early, reordered = [], False
    for i, r in enumerate(records):
        started = r.attempts[0].started or 0.0
        known = slots.peers(p for p in records[:i] if (p.attempts[0].ended or 0.0) <= started)
        expected = {q.trial_id: slots.expected_s(q.spec.params, known, limit_s) for q in records[i:]}
        if expected[r.trial_id] < max(expected.values()):
            early.append(f"{r.trial_id} (expected {expected[r.trial_id]:.2f} s) while {max(expected, key=expected.__getitem__)} waited")
        reordered |= any(q.trial_id < r.trial_id for q in records[i + 1 :])
    return early, reordered
