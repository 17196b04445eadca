"""Whether a search's trials fail for one reason that is not the design's: stop it (pure).

The first ``k`` trials to reach a result (completed, pruned, or failed for good after the
reproducibility retry) all failed with one ``FailureSignature``: the trainer (or its environment)
is broken, and every further trial would spend its budget to say so again. ``k`` is the frozen
contract's ``budget.systematic_failures`` (0: never stop). The first k results never change once
recorded (journals are append-only), so a relaunch decides the same and is held the same.

Must not: write, or stop anything; the launch's follower records the hold and stops dispatching.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import TrialRecord, TrialState
from parcel_hpc.ledger.events import FailureSignature

# What a search frozen before ``budget.systematic_failures`` existed stops at (the budget group's default).
BEFORE_PINNED = 3


def threshold(budget: Mapping[str, Any]) -> int:
    """``k`` from the contract's budget."""
    return int(budget.get("systematic_failures", BEFORE_PINNED))


@dataclass(frozen=True)
class SystematicFailure:
    trials: tuple[str, ...]  # the first k, in the order they failed
    signature: FailureSignature
    message: str  # the first one's error text, as the worker wrote it

    outcome: Outcome = Outcome.HOLD_SYSTEMATIC_FAILURE

    def text(self, search_path: str) -> str:
        return (
            f"{' '.join(self.trials)} failed alike: {self.signature.cause.value} {self.message}; dispatching stopped, the trials not yet run stay queued. "
            f"See `parcel-hpc logs {search_path} {self.trials[0]}`; the contract is frozen, so a fixed trainer is a new search.revision"
        )

    def to_json(self) -> dict:
        s = self.signature
        return {
            "outcome": str(self.outcome),
            "trials": list(self.trials),
            "signature": {"cause": s.cause.value, "error_type": s.error_type, "message": s.message},
            "message": self.message,
        }


def _result_time(record: TrialRecord) -> float:
    return record.ended_at if record.ended_at is not None else float("inf")


def decide(records: Iterable[TrialRecord], k: int) -> SystematicFailure | None:
    """The hold, when the first ``k`` results are failures with one signature; else None (pure).
    Trials without a result about the design (queued, running, rejected, cancelled, given up after
    infrastructure interruptions) neither count nor break the run."""
    if k <= 0:
        return None
    results: list[tuple[float, str, FailureSignature | None, str]] = []
    for r in records:
        if r.state in (TrialState.COMPLETED, TrialState.PRUNED):
            results.append((_result_time(r), r.trial_id, None, ""))
        elif r.state is TrialState.FAILED and r.cause is not None and r.cause.is_training_failure():
            failed = [a for a in r.attempts if a.signature() is not None]
            results.append((_result_time(r), r.trial_id, failed[-1].signature() if failed else None, failed[-1].message if failed else ""))
    first = sorted(results)[:k]
    if len(first) < k:
        return None
    signatures = {sig for _, _, sig, _ in first}
    if len(signatures) != 1 or None in signatures:
        return None
    (signature,) = signatures
    assert signature is not None
    return SystematicFailure(tuple(tid for _, tid, _, _ in first), signature, first[0][3])


def first_alike(signatures: Sequence[FailureSignature | None], k: int) -> bool:
    """Whether the first ``k`` attempts of a pack all failed with one signature (pure): the pack
    then runs no more of its trials. Not a hold: first failures are not yet reproduced; the
    follower checks each one, alone, before it decides."""
    return k > 0 and len(signatures) >= k and None not in signatures[:k] and len(set(signatures[:k])) == 1
