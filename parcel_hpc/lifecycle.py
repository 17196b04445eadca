"""What to do next with a trial, from its record and what the scheduler says (pure).

Infrastructure interruptions (preemption, node failure, time limit, system cancel, a job that
vanished) are retried from the trial's checkpoint up to ``max_retries``. A training failure is
retried once to see whether it reproduces; the second failure of the same class is final (the
worker records it so). A quarantined trial is rerun cleanly, a bounded number of times.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .ledger.records import TrialRecord
from .ledger.states import AttemptEnd, TrialState

MAX_QUARANTINE_RERUNS = 2


class Action(enum.Enum):
    NONE = "none"  # finished: never dispatched again
    WAIT = "wait"  # a live job holds it (pending, running, requeued by the scheduler)
    DISPATCH = "dispatch"  # never dispatched yet
    RETRY = "retry"  # dispatch again under the same trial_id, resuming its own checkpoint
    RESOLVE_LOST = "resolve_lost"  # the ledger says running but no job is alive: record that first
    GIVE_UP = "give_up"  # retry limit reached: end it as failed


@dataclass(frozen=True)
class Next:
    action: Action
    reason: str = ""


def interruption_counts(record: TrialRecord) -> tuple[int, int]:
    """(preemptions, other infrastructure interruptions) over the trial's attempts."""
    # A superseded attempt was replaced by a live one; it is not an interruption of the trial.
    causes = [a.cause for a in record.attempts if a.how is not None and a.how.is_infrastructure() and a.cause != "superseded"]
    preempted = sum(1 for c in causes if c == "preempted")
    return preempted, len(causes) - preempted


def next_action(record: TrialRecord, *, dispatches: int, job_alive: bool, max_retries: int, max_preemptions: int = 10,
                dispatch_in_flight: bool = False) -> Next:
    """``dispatch_in_flight``: another launcher claimed the latest dispatch moments ago and has not
    recorded its job yet; waiting for it is what keeps two launchers from dispatching one trial twice."""
    state = record.state
    if state.is_finished():
        return Next(Action.NONE)
    if job_alive or dispatch_in_flight:
        return Next(Action.WAIT)
    if state is TrialState.RUNNING:
        return Next(Action.RESOLVE_LOST, "the ledger says running but its job is gone")
    if dispatches == 0:
        return Next(Action.DISPATCH)
    never_started = dispatches - sum(1 for a in record.attempts if a.started is not None)
    if never_started > max_retries + 1:
        # Jobs that die before the worker runs add no attempt: bound them on their own.
        return Next(Action.GIVE_UP, f"{never_started} dispatches whose job ended before the worker started")
    if state is TrialState.QUARANTINED:
        times = max(len(record.quarantines), sum(1 for a in record.attempts if a.how is AttemptEnd.QUARANTINED))
        if times > MAX_QUARANTINE_RERUNS:
            return Next(Action.GIVE_UP, f"quarantined {times} times")
        return Next(Action.RETRY, "clean rerun after quarantine")
    if record.failures and record.reason.startswith("retry:"):
        return Next(Action.RETRY, f"checking whether {record.failures[-1]} reproduces")
    preempted, other = interruption_counts(record)
    if other > max_retries:
        return Next(Action.GIVE_UP, f"{other} infrastructure interruptions > budget.max_retries={max_retries}")
    if preempted > max_preemptions:
        return Next(Action.GIVE_UP, f"{preempted} preemptions > budget.max_preemptions={max_preemptions}")
    if record.interrupted or record.reason.startswith("interrupted"):
        return Next(Action.RETRY, record.reason or "interrupted")
    # Dispatched, no live job, no attempt recorded: the job died before the worker started.
    return Next(Action.RETRY, "the job ended before the worker started")
