"""Trial states and how an attempt ended, as Enums with predicates (never bare strings)."""

from __future__ import annotations

import enum


class TrialState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"
    FAILED = "failed"
    QUARANTINED = "quarantined"
    REJECTED = "rejected"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"  # by an owner (`parcel-hpc cancel`): never retried, resubmitted or scored

    def is_finished(self) -> bool:
        """Finished trials are never dispatched again (a quarantined one is rerun cleanly)."""
        return self in _FINISHED

    def is_result(self) -> bool:
        """States that count as a result about the design (a reproducible failure does)."""
        return self in (TrialState.COMPLETED, TrialState.PRUNED, TrialState.FAILED)


class MetricResume(str, enum.Enum):
    """How a trial's metric stands against an uninterrupted run's."""

    UNINTERRUPTED = "uninterrupted"  # never resumed
    EXACT = "exact"  # resumed, under the launch's check that resuming is exact: bit-equal to an uninterrupted run
    WITHIN_TOLERANCE = "within_tolerance"  # resumed under a declared train.resume_tolerance: close to, not equal to, an uninterrupted run

    def is_exact(self) -> bool:
        return self is not MetricResume.WITHIN_TOLERANCE

    def mark(self) -> str:
        """What a metric shown anywhere (status, the report, MLflow) carries beside it: "" when it is
        an uninterrupted run's, exactly; else it never passes for exact."""
        return "" if self.is_exact() else "resumed within train.resume_tolerance"


_FINISHED = frozenset({TrialState.COMPLETED, TrialState.PRUNED, TrialState.FAILED, TrialState.REJECTED, TrialState.BUDGET_EXHAUSTED, TrialState.CANCELLED})


class AttemptEnd(str, enum.Enum):
    """How one attempt (one run of the worker process) ended."""

    COMPLETED = "completed"
    PRUNED = "pruned"
    FAILED = "failed"  # an error in training: classified, retried once to see if it reproduces
    INTERRUPTED = "interrupted"  # infrastructure: preemption, timeout, node failure, system cancel
    LOST = "lost"  # the process or job vanished without saying how (resolved from the scheduler)
    REJECTED = "rejected"
    QUARANTINED = "quarantined"
    BUDGET_EXHAUSTED = "budget_exhausted"

    def is_infrastructure(self) -> bool:
        return self in (AttemptEnd.INTERRUPTED, AttemptEnd.LOST)
