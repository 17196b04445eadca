"""Budgets enforced, not monitored.

Two halves, one vocabulary (``BudgetCaps``, ``Rates``, ``JournalTotals``, ``CapLine``):
- admission (pure): ``worst_case`` -> ``Commitment``; ``admit_launch`` -> ``BudgetDecision``
  (``admit`` or ``hold:budget``, with the overshoot and what to change); ``render_commitment``;
  ``admit_account``: the same worst case against the SLURM association's GrpTRESMins and
  GrpTRESRunMins (``AssociationLimit``), what the account may still use;
- the reservation journal (``BudgetLedger``): every attempt reserves its worst case before it runs
  and settles what it used after, against caps that concurrent processes on several nodes cannot
  overshoot, with nothing but create-exclusive files on the shared search directory;
  ``BudgetLedger.read`` (every hold, ``JournalView``) and ``read_totals`` read it without writing
  (read commands);
- one search's budget from its frozen contract: ``search_caps``, ``launch_decision``,
  ``SearchBudget`` (reserve, hold, settle an attempt, restate it once the scheduler's record of its
  run came), ``attempt_usage`` (what an attempt used: the one rule for settling and for counting),
  ``counted_gpus`` (the GPUs an allocation's hours are counted with, everywhere).

Must not: dispatch, mark trial states, or measure usage; callers do those with these decisions.
"""

from parcel_hpc.budget._admission import (
    BudgetDecision,
    Commitment,
    admit_account,
    admit_launch,
    attempt_worst_case,
    render_account,
    render_commitment,
    worst_case,
)
from parcel_hpc.budget._journal import BudgetLedger, BudgetOutcome, Hold, JournalView, KeyState, Refusal, Reservation, ReservationKey, Settlement
from parcel_hpc.budget._search import SearchBudget, attempt_usage, launch_decision, search_caps
from parcel_hpc.budget._values import AssociationLimit, BudgetCaps, CapLine, JournalTotals, LimitKind, Rates, counted_gpus, hours_between

__all__ = [
    "hours_between",
    "counted_gpus",
    "attempt_usage",
    "Hold",
    "JournalView",
    "AssociationLimit",
    "LimitKind",
    "admit_account",
    "render_account",
    "BudgetCaps",
    "BudgetDecision",
    "BudgetLedger",
    "BudgetOutcome",
    "CapLine",
    "Commitment",
    "KeyState",
    "Rates",
    "Refusal",
    "Reservation",
    "SearchBudget",
    "ReservationKey",
    "Settlement",
    "JournalTotals",
    "admit_launch",
    "attempt_worst_case",
    "launch_decision",
    "render_commitment",
    "search_caps",
    "worst_case",
]
