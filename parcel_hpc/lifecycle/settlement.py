"""Budget holds of attempts that ended, settled whoever saw the end, and restated once the
scheduler's record of their run came.

An attempt reserves its worst case before it trains and settles what it used when it ends. Its own
worker settles an ending it records (``worker.attempt``); every other ending is recorded by someone
else and settled here, with the hours the spend counts for it (``accounting.spend``): a vanished
attempt resolved by the launch's follower, ``resubmit`` or ``sync``, one resolved by the next
attempt of its trial (a requeue: the ``lost`` the scheduler's requeue leaves), and the attempts of
cancelled trials once their jobs are gone. Settling is idempotent (the first close stands), so two
launchers, ``resubmit`` and ``sync`` may each settle the same ending.

An attempt that did not say how it ended counts to where the ledger noticed its loss until the
scheduler's record of its run says when the run ended (``lifecycle.resolution.record_filed_runs``
records it); a hold settled at the earlier figure is then restated here.

Must not: decide how an attempt ended (``resolution`` does), or ask the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from parcel_hpc.accounting.spend import StaleHold, stale_holds
from parcel_hpc.budget import BudgetLedger, SearchBudget
from parcel_hpc.ledger import SearchDir, TrialRecord


def settle_ended(
    search: SearchDir, records: Iterable[TrialRecord] | None = None, gone_at: Mapping[str, float] | None = None, budget: SearchBudget | None = None
) -> list[StaleHold]:
    """Settle every stale hold of ``records`` (default: every trial of the search), and restate every
    settled one the scheduler's record has changed; what was done. ``budget``: the caller's open
    journal (a worker keeps one)."""
    view = BudgetLedger.read(search.path)
    if view is None:
        return []  # nothing was ever reserved
    found = stale_holds(search.records() if records is None else records, view.holds, gone_at)
    if found:
        budget = budget or SearchBudget(search.path, search.contract())
        for s in found:
            if s.settled:
                budget.restate(s.key.trial_id, s.key.attempt, s.used.gpu_hours, s.used.cpu_hours)
            else:
                budget.ledger.settle(s.key, s.used.gpu_hours, s.used.cpu_hours, first_wins=True)
    return found
