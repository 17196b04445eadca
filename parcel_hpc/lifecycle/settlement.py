"""Budget holds of attempts that ended: found (pure) and settled (the edge), whoever saw the end.

An attempt reserves its worst case before it trains and settles what it used when it ends. Its own
worker settles an ending it records (``worker.attempt``); every other ending is recorded by someone
else and settled here, with the hours the ledger saw it run (``budget.attempt_usage``): a vanished
attempt resolved by the launch's follower, ``resubmit`` or ``sync``, one resolved by the next
attempt of its trial (a requeue: the ``lost`` the scheduler's requeue leaves), and the attempts of
cancelled trials once their jobs are gone. Settling is idempotent (the first close stands), so two
launchers, ``resubmit`` and ``sync`` may each settle the same ending.

``stale_holds`` is also how ``reconcile`` (read-only) flags a hold left on an ended attempt.

Must not: decide how an attempt ended (``resolution`` does) or write trial events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parcel_hpc.budget import BudgetLedger, Hold, KeyState, ReservationKey, SearchBudget
from parcel_hpc.ledger import SearchDir, TrialRecord


@dataclass(frozen=True)
class StaleHold:
    """A reservation still held for an attempt the ledger saw end (or whose job is gone)."""

    key: ReservationKey
    started: float
    ended: float  # the ledger's end, or when its job was seen gone
    gpus: int | None  # what the scheduler allocated it (None: the request)
    held_gpu_hours: float  # the worst case still charged to the cap
    held_cpu_hours: float


def stale_holds(records: Iterable[TrialRecord], holds: Mapping[ReservationKey, Hold], gone_at: Mapping[str, float] | None = None) -> list[StaleHold]:
    """Held reservations of attempts that ended in the ledger (pure). ``gone_at``: trial -> when
    its job was seen gone (``cancel``), which ends its attempts that never said how. An attempt
    with no recorded start keeps its hold: its hours are unknown, and a hold is never settled for
    less than was used."""
    gone_at = gone_at or {}
    out = []
    for r in records:
        for a in r.attempts:
            hold = holds.get(ReservationKey(r.trial_id, a.number))
            if hold is None or hold.state is not KeyState.HELD or a.started is None:
                continue
            ended = a.ended if a.how is not None else gone_at.get(r.trial_id)
            if ended is None:
                continue  # it runs
            out.append(StaleHold(ReservationKey(r.trial_id, a.number), a.started, ended, a.gpus, hold.reserved_gpu_hours, hold.reserved_cpu_hours))
    return out


def settle_ended(
    search: SearchDir, records: Iterable[TrialRecord] | None = None, gone_at: Mapping[str, float] | None = None, budget: SearchBudget | None = None
) -> list[StaleHold]:
    """Settle every stale hold of ``records`` (default: every trial of the search); what was settled.
    ``budget``: the caller's open journal (a worker keeps one)."""
    view = BudgetLedger.read(search.path)
    if view is None:
        return []  # nothing was ever reserved
    found = stale_holds(search.records() if records is None else records, view.holds, gone_at)
    if found:
        budget = budget or SearchBudget(search.path, search.contract())
        for s in found:
            budget.settle(s.key.trial_id, s.key.attempt, s.started, s.ended, s.gpus)
    return found
