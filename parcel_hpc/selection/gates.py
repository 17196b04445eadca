"""The release gates, one class each, used by ``select`` (its disposition) and ``release`` (its
checks): what a selected trial must pass, and the hold each failure causes (pure).

    Lineage       data:          the winner's lineage is clean (as frozen, and still now)
    Reproducible  reproducible:  its rerun lands within the tolerance, and the artifact rescores it
    Slices        slices:        no slice worse than the baseline's beyond the gate, or a decision
    Performance   performance:   overall at least as good as the approved baseline
    Parity        parity:        the served artifact predicts as training did
    Final         final:         the protected final partition was evaluated, for this selection

``select`` decides on the first three (the rest need the final evaluation); ``release`` reports all
six, and the first that did not pass names the hold. Adding a gate: a class here, in ``GATES``.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from parcel_hpc.governance.outcome import Outcome


@dataclass(frozen=True)
class RerunCheck:
    selected_metric: float
    rerun_metric: float | None  # None: the rerun did not produce a result
    tolerance: float
    artifact_metric: float | None = None  # the selected artifact rescored; must equal selected_metric

    @property
    def within(self) -> bool:
        if self.rerun_metric is None or not math.isfinite(self.rerun_metric):
            return False
        if self.artifact_metric is not None and abs(self.artifact_metric - self.selected_metric) > 1e-9:
            return False
        return abs(self.rerun_metric - self.selected_metric) <= self.tolerance + 1e-12

    def describe(self) -> str:
        if self.rerun_metric is None:
            return f"the rerun produced no result (selected {self.selected_metric:.4f})"
        text = f"selected {self.selected_metric:.4f}, rerun {self.rerun_metric:.4f}, |difference| {abs(self.rerun_metric - self.selected_metric):.4f}, tolerance {self.tolerance:g}"
        if self.artifact_metric is not None and abs(self.artifact_metric - self.selected_metric) > 1e-9:
            text += f"; the selected artifact rescores {self.artifact_metric:.4f}"
        return text


class Check(str, enum.Enum):
    """A gate's verdict; ``decided``: a failed slice gate that a documented decision accepted."""

    PASSED = "passed"
    DECIDED = "decided"
    FAILED = "failed"
    MISSING = "missing"  # its evidence does not exist yet (no rerun, no final evaluation)

    @property
    def clears(self) -> bool:
        return self in (Check.PASSED, Check.DECIDED)


@dataclass(frozen=True)
class GateFacts:
    """Everything a gate reads, as plain values (None: not known yet)."""

    lineage_as_frozen: bool  # the winner was a candidate with clean lineage when the list froze
    lineage_now: bool | None = None  # and still is (None: not asked; select reads it as frozen)
    rerun: RerunCheck | None = None
    slice_gate_passed: bool | None = None
    decided: bool = False  # a documented quality decision accepted the selected trial
    overall: tuple[float, float] | None = None  # (winner, baseline) miss-cost over the validation set
    parity_passed: bool | None = None
    final_matches: bool | None = None  # the final result is about this selection, trial and artifact


class Gate(ABC):
    name: ClassVar[str]  # the check's key in the release packet
    hold: ClassVar[Outcome]  # what a selection holds at when this gate does not pass

    @abstractmethod
    def check(self, facts: GateFacts) -> Check: ...


class Lineage(Gate):
    name = "data"
    hold = Outcome.HOLD_INVALID_WINNER

    def check(self, facts: GateFacts) -> Check:
        return Check.PASSED if facts.lineage_as_frozen and facts.lineage_now is not False else Check.FAILED


class Reproducible(Gate):
    name = "reproducible"
    hold = Outcome.HOLD_INVALID_WINNER

    def check(self, facts: GateFacts) -> Check:
        if facts.rerun is None:
            return Check.MISSING
        return Check.PASSED if facts.rerun.within else Check.FAILED


class Slices(Gate):
    name = "slices"
    hold = Outcome.HOLD_SLICE_QUALITY

    def check(self, facts: GateFacts) -> Check:
        if facts.slice_gate_passed is None:
            return Check.MISSING
        return Check.PASSED if facts.slice_gate_passed else Check.DECIDED if facts.decided else Check.FAILED


class Performance(Gate):
    name = "performance"
    hold = Outcome.hold("performance")

    def check(self, facts: GateFacts) -> Check:
        if facts.overall is None:
            return Check.MISSING
        winner, baseline = facts.overall
        return Check.PASSED if winner <= baseline else Check.FAILED


class Parity(Gate):
    name = "parity"
    hold = Outcome.hold("serving-parity")

    def check(self, facts: GateFacts) -> Check:
        return Check.MISSING if facts.parity_passed is None else Check.PASSED if facts.parity_passed else Check.FAILED


class Final(Gate):
    name = "final"
    hold = Outcome.hold("final-not-evaluated")

    def check(self, facts: GateFacts) -> Check:
        return Check.MISSING if facts.final_matches is None else Check.PASSED if facts.final_matches else Check.FAILED


GATES: tuple[Gate, ...] = (Lineage(), Reproducible(), Slices(), Performance(), Parity(), Final())  # in the order a hold is named
SHOWN = ("data", "reproducible", "performance", "parity", "slices", "final")  # the order the packet and `release` list them
BEFORE_FINAL: tuple[Gate, ...] = GATES[:3]  # what a selection must clear before the final partition may be read


def checks(facts: GateFacts) -> dict[str, Check]:
    """Every gate's verdict, in the order the packet shows them."""
    verdicts = {gate.name: gate.check(facts) for gate in GATES}
    return {name: verdicts[name] for name in SHOWN}


def first_hold(facts: GateFacts, gates: tuple[Gate, ...] = GATES) -> Gate | None:
    """The first gate that does not clear, or None."""
    return next((gate for gate in gates if not gate.check(facts).clears), None)


def release_outcome(verdicts: dict[str, Check]) -> Outcome:
    """``release:registered``, or the hold of the first gate (in ``GATES`` order) that did not clear."""
    for gate in GATES:
        if not Check(verdicts[gate.name]).clears:
            return gate.hold
    return Outcome.RELEASE_REGISTERED
