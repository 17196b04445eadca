"""What to do next with a trial, from its record and what the scheduler says (pure).

Infrastructure interruptions (preemption, node failure, time limit, system cancel, a job that
vanished) are retried from the trial's checkpoint up to ``max_retries``. A training failure is
retried once to see whether it reproduces; the second failure of the same class is final (the
worker records it so). A quarantined trial is rerun cleanly, a bounded number of times. A trial
whose worker found the environment drifted from the contract is rerun as it was: nothing of it ran.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.ledger import Attempt, AttemptEnd, Cause, Ended, Started, TrialRecord, TrialState

MAX_QUARANTINE_RERUNS = 2


@dataclass(frozen=True)
class RetryPolicy:
    """How often infrastructure may interrupt one trial; read from the frozen contract's budget
    (the ``budget`` config group holds the defaults, nothing else does)."""

    max_retries: int  # timeouts, node failures, lost jobs, system cancels
    max_preemptions: int  # preemptions: the cluster's choice, not the trial's, so counted apart

    @classmethod
    def from_budget(cls, budget: Mapping[str, Any]) -> RetryPolicy:
        return cls(int(budget["max_retries"]), int(budget["max_preemptions"]))

    def exceeded(self, preempted: int, other: int) -> str:
        """Which limit these counts break, in words; "" while within both."""
        if other > self.max_retries:
            return f"{other} infrastructure interruptions > budget.max_retries={self.max_retries}"
        if preempted > self.max_preemptions:
            return f"{preempted} preemptions > budget.max_preemptions={self.max_preemptions}"
        return ""


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
    check: bool = False  # a retry that checks whether a training failure reproduces


def interruption_counts(record: TrialRecord) -> tuple[int, int]:
    """(preemptions, other infrastructure interruptions) over the trial's attempts."""
    # A superseded attempt was replaced by a live one; it is not an interruption of the trial.
    causes = [c for c in (a.interruption() for a in record.attempts) if c is not None]
    preempted = sum(1 for c in causes if c is Cause.PREEMPTED)
    return preempted, len(causes) - preempted


def next_action(record: TrialRecord, *, dispatches: int, job_alive: bool, policy: RetryPolicy, dispatch_in_flight: bool = False) -> Next:
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
    if never_started > policy.max_retries + 1:
        # Jobs that die before the worker runs add no attempt: bound them on their own.
        return Next(Action.GIVE_UP, f"{never_started} dispatches whose job ended before the worker started")
    if state is TrialState.QUARANTINED:
        times = max(len(record.quarantines), sum(1 for a in record.attempts if a.how is AttemptEnd.QUARANTINED))
        if times > MAX_QUARANTINE_RERUNS:
            return Next(Action.GIVE_UP, f"quarantined {times} times")
        return Next(Action.RETRY, "clean rerun after quarantine")
    if record.awaiting_environment():
        # Nothing ran: a drift rejection spends no retry (the launch that saw it stopped dispatching).
        return Next(Action.RETRY, "its worker's environment differed from the contract; rerun now it matches")
    if record.awaiting_failure_check():
        assert record.cause is not None  # awaiting_failure_check() checked it
        return Next(Action.RETRY, f"checking whether {record.cause.value} reproduces", check=True)
    limit = policy.exceeded(*interruption_counts(record))
    if limit:
        return Next(Action.GIVE_UP, limit)
    if record.interrupted or record.awaiting_retry_after_interruption():
        return Next(Action.RETRY, record.reason or "interrupted")
    # Dispatched, no live job, no attempt recorded: the job died before the worker started.
    return Next(Action.RETRY, "the job ended before the worker started")


def previous_attempt_ending(last: Attempt, facts: Started) -> Ended:
    """A new attempt found the previous one without an ending: SLURM requeued it, or it was lost."""
    requeued = facts.restart_count > last.restart_count  # only a scheduler that requeues counts restarts
    return Ended(
        AttemptEnd.LOST,
        Cause.REQUEUED_BY_SCHEDULER if requeued else Cause.LOST,
        job_id=last.job_id,
        message="the attempt ended without recording how; its job was requeued or resubmitted",
    )
