"""The selection's gates, one class each, used by ``select`` (its disposition), ``decide``,
``evaluate-final`` and ``release`` (its checks): what a selected trial must pass, the rule each
one applies (word for word as docs/selection-and-release.md defines it), the numbers it judged,
the hold each failure causes and what lifts it (pure).

    Lineage            data:               clean lineage (as frozen, and still now)
    Reproducible       reproducible:       the artifact rescores, the rerun lands within tolerance
    Parity             parity:             the served artifact predicts as training did
    Performance        performance:        no worse than the approved baseline beyond the margin
    Slices             slices:             no slice worse than the baseline's beyond the gate
    Final              final:              the final partition was evaluated, for this selection
    FinalPerformance   final-performance:  the contract's final-partition rule, when it pins one

Everything that can be judged on validation (``BEFORE_FINAL``) is judged at ``select``, before the
final partition may be claimed: the final evaluation confirms a decision, it does not make it. A
performance, slice or final-performance hold is a trade a team may make knowingly
(``Outcome.is_decidable``: ``decide`` records who and why); no gate leads to a revision that can
neither be released nor decided. Adding a gate: a class here, in ``GATES``, and its definition in
the docs (tests/test_selection.py checks each one is there).
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.selection.slices import GateResult

TOLERANCE = 1e-12  # float noise allowed on every comparison against a limit


@dataclass(frozen=True)
class RerunCheck:
    selected_metric: float
    rerun_metric: float | None  # None: the rerun did not produce a result
    tolerance: float
    artifact_metric: float | None = None  # the selected artifact rescored; must equal selected_metric
    fold: int | None = None  # of a K-fold winner: the fold this check is of (``worst_fold``)

    @classmethod
    def worst_fold(cls, selected: Sequence[float], rerun: Sequence[float], tolerance: float, artifact: Sequence[float]) -> RerunCheck:
        """A K-fold winner's rerun: each fold's rerun and rescored checkpoint against the value that
        fold was selected with; the check of the fold furthest off, which passes only if every fold's does."""
        checks = [cls(s, r, tolerance, a, k) for k, (s, r, a) in enumerate(zip(selected, rerun, artifact, strict=True))]
        return min(checks, key=lambda c: (c.within, -abs(cast(float, c.rerun_metric) - c.selected_metric)))

    @property
    def within(self) -> bool:
        if self.rerun_metric is None or not math.isfinite(self.rerun_metric):
            return False
        if self.artifact_metric is not None and abs(self.artifact_metric - self.selected_metric) > 1e-9:
            return False
        return abs(self.rerun_metric - self.selected_metric) <= self.tolerance + TOLERANCE

    def describe(self) -> str:
        if self.rerun_metric is None:
            return f"the rerun produced no result (selected {self.selected_metric:.4f})"
        text = f"fold {self.fold} (the furthest off): " if self.fold is not None else ""
        text += f"selected {self.selected_metric:.4f}, rerun {self.rerun_metric:.4f}, |difference| {abs(self.rerun_metric - self.selected_metric):.4f}, tolerance {self.tolerance:g}"
        if self.artifact_metric is not None and abs(self.artifact_metric - self.selected_metric) > 1e-9:
            text += f"; the selected artifact rescores {self.artifact_metric:.4f}"
        return text


@dataclass(frozen=True)
class ParityCheck:
    """The served model (built without examples, given the artifact's state) against training's predictions."""

    difference: float | None  # max |serve - predict| over the validation images; None: it could not serve
    tolerance: float
    problem: str = ""  # what serving raised, when it could not

    @property
    def within(self) -> bool:
        return self.difference is not None and self.difference <= self.tolerance + TOLERANCE  # NaN is never within

    def describe(self) -> str:
        if self.difference is None:
            return f"it could not serve: {self.problem or 'no answer'}"
        return f"max |serve - predict| {self.difference:.2e}, tolerance {self.tolerance:g}"


@dataclass(frozen=True)
class Comparison:
    """A miss-cost of the winner against the approved baseline's on one partition, and the margin
    the contract allows it above the baseline's (None: no rule, reported only)."""

    winner: float
    baseline: float
    margin: float | None

    @property
    def limit(self) -> float | None:
        return None if self.margin is None else self.baseline + self.margin

    @property
    def within(self) -> bool:
        return self.limit is None or self.winner <= self.limit + TOLERANCE

    def describe(self) -> str:
        text = f"winner {self.winner:.4f}, baseline {self.baseline:.4f}"
        if self.limit is None:
            return f"{text}: reported, no rule pinned"
        over = self.winner - self.limit
        return f"{text}, limit {self.limit:.4f} (baseline + {self.margin:g}): " + (f"over by {over:.4f}" if over > TOLERANCE else "within")


class JudgedOn(str, enum.Enum):
    """The predictions the performance and slice gates judged: a validation partition's, or (a K-fold
    search) each non-final frame's from the fold that validated it."""

    VALIDATION = "validation"
    OUT_OF_FOLD = "out-of-fold"

    @property
    def predictions(self) -> str:
        return "validation" if self is JudgedOn.VALIDATION else "out-of-fold predictions"


@dataclass(frozen=True)
class GateFacts:
    """Everything a gate reads, as plain values (None: not known yet)."""

    lineage_as_frozen: bool  # the winner was a candidate with clean lineage when the list froze
    lineage_now: bool | None = None  # and still is (None: not asked; select reads it as frozen)
    rerun: RerunCheck | None = None
    parity: ParityCheck | None = None
    performance: Comparison | None = None  # validation miss-cost, against the pinned margin
    slices: GateResult | None = None
    decided: frozenset[Outcome] = frozenset()  # the holds documented decisions lifted for this trial
    final_matches: bool | None = None  # the final result is about this selection, trial and artifact
    final: Comparison | None = None  # final-partition miss-cost, against the contract's final rule
    judged_on: JudgedOn = JudgedOn.VALIDATION


class Check(str, enum.Enum):
    """A gate's verdict; ``decided``: a failed decidable gate that a documented decision accepted."""

    PASSED = "passed"
    DECIDED = "decided"
    FAILED = "failed"
    MISSING = "missing"  # its evidence does not exist yet (no rerun, no final evaluation)

    @property
    def clears(self) -> bool:
        return self in (Check.PASSED, Check.DECIDED)


@dataclass(frozen=True)
class Judgement:
    """One gate's verdict on one selection, with its rule, the numbers it judged and what lifts its hold."""

    gate: str
    check: Check
    hold: Outcome
    rule: str  # the definition, with the contract's pinned numbers
    found: str  # what it judged ("" while its evidence is missing)
    lift: str

    def to_json(self) -> dict[str, Any]:
        return {"gate": self.gate, "check": self.check.value, "hold": str(self.hold), "rule": self.rule, "found": self.found, "lift": self.lift}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Judgement:
        return cls(str(obj["gate"]), Check(obj["check"]), Outcome.parse(obj["hold"]), str(obj["rule"]), str(obj["found"]), str(obj["lift"]))

    def lines(self) -> tuple[str, ...]:
        """How a hold is said: its rule, its numbers, what lifts it."""
        return (f"rule ({self.gate}): {self.rule}", f"found: {self.found or 'no evidence yet'}", f"to lift it: {self.lift}")


ANOTHER_TRIAL = "another trial (`parcel-hpc select SEARCH --trial T --reason TEXT`) or a new search revision"
DECIDE = "`parcel-hpc decide SEARCH --accept --by NAME --reason TEXT` (the trade, recorded with who and why)"


class Gate(ABC):
    name: ClassVar[str]  # the check's key in the release packet
    hold: ClassVar[Outcome]  # what a selection holds at when this gate does not pass
    definition: ClassVar[str]  # the rule, word for word as the docs define it
    lift: ClassVar[str]

    @abstractmethod
    def verdict(self, facts: GateFacts) -> Check: ...

    @abstractmethod
    def found(self, facts: GateFacts) -> str:
        """The numbers the verdict rests on (called only when its evidence exists)."""

    def rule(self, facts: GateFacts) -> str:
        return self.definition

    def check(self, facts: GateFacts) -> Check:
        verdict = self.verdict(facts)
        return Check.DECIDED if verdict is Check.FAILED and self.hold.is_decidable and self.hold in facts.decided else verdict

    def judge(self, facts: GateFacts) -> Judgement:
        verdict = self.check(facts)
        return Judgement(self.name, verdict, self.hold, self.rule(facts), "" if verdict is Check.MISSING else self.found(facts), self.lift)


class Lineage(Gate):
    name = "data"
    hold = Outcome.HOLD_INVALID_WINNER
    definition = "the selected trial is a completed candidate with clean lineage, as the list froze and still now"
    lift = ANOTHER_TRIAL

    def verdict(self, facts: GateFacts) -> Check:
        return Check.PASSED if facts.lineage_as_frozen and facts.lineage_now is not False else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        if not facts.lineage_as_frozen:
            return "not a candidate with clean lineage when the list froze"
        return "clean lineage" if facts.lineage_now is not False else "its lineage is no longer clean (quarantined or invalidated since)"


class Reproducible(Gate):
    name = "reproducible"
    hold = Outcome.HOLD_INVALID_WINNER
    definition = "the selected artifact rescores to the metric it was selected by, and its rerun lands within selection.rerun_tolerance of it"
    lift = ANOTHER_TRIAL

    def verdict(self, facts: GateFacts) -> Check:
        if facts.rerun is None:
            return Check.MISSING
        return Check.PASSED if facts.rerun.within else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        assert facts.rerun is not None
        return facts.rerun.describe()


class Parity(Gate):
    name = "parity"
    hold = Outcome.HOLD_SERVING_PARITY
    definition = (
        "a trainer built without examples and given the artifact's state serves raw validation images as training's predict scored them, "
        "within selection.parity_tolerance per image"
    )
    lift = "make the trainer's serve() reproduce predict() from its state alone, then a new search revision"

    def verdict(self, facts: GateFacts) -> Check:
        if facts.parity is None:
            return Check.MISSING
        return Check.PASSED if facts.parity.within else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        assert facts.parity is not None
        return facts.parity.describe()


class Performance(Gate):
    name = "performance"
    hold = Outcome.HOLD_PERFORMANCE
    definition = (
        "the winner's validation miss-cost (a K-fold search's: out-of-fold) does not exceed the approved baseline's by more than selection.performance_margin"
    )
    lift = f"{DECIDE}, {ANOTHER_TRIAL}"

    def rule(self, facts: GateFacts) -> str:
        return self.definition + ("" if facts.performance is None else f" ({facts.performance.margin:g})")

    def verdict(self, facts: GateFacts) -> Check:
        if facts.performance is None:
            return Check.MISSING
        return Check.PASSED if facts.performance.within else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        assert facts.performance is not None
        return f"{facts.judged_on.value} miss-cost {facts.performance.describe()}"


class Slices(Gate):
    name = "slices"
    hold = Outcome.HOLD_SLICE_QUALITY
    definition = (
        "on no gated slice does the winner's recall drop more than selection.gate.max_recall_drop, or its miss-cost rise more than "
        "selection.gate.max_miss_cost_rise, against the baseline's, and every slice named in selection.gate.min_recall reaches that recall"
    )
    lift = f"{DECIDE}, {ANOTHER_TRIAL}"

    def verdict(self, facts: GateFacts) -> Check:
        if facts.slices is None:
            return Check.MISSING
        return Check.PASSED if facts.slices.passed else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        assert facts.slices is not None
        failures = facts.slices.failures
        if not failures:
            return f"{len(facts.slices.findings)} slice checks on {facts.judged_on.predictions}, none failed"
        shown = "; ".join(f.describe() for f in failures[:3]) + ("; ..." if len(failures) > 3 else "")
        return f"{len(failures)} of {len(facts.slices.findings)} slice checks on {facts.judged_on.predictions} failed: {shown}"


class Final(Gate):
    name = "final"
    hold = Outcome.HOLD_FINAL_NOT_EVALUATED
    definition = "the final partition was evaluated once, for this selection, its trial and the artifact its rerun checked"
    lift = "`parcel-hpc evaluate-final SEARCH` (once per search revision)"

    @staticmethod
    def matches(final: Mapping[str, Any] | None, selection: int, trial_id: str, checked_artifact: str | None) -> bool | None:
        """Whether the final result is about this selection, its trial and the artifact its rerun checked (None: no final result)."""
        if final is None:
            return None
        return final["selection"] == selection and final["trial_id"] == trial_id and final["winner"]["artifact_sha256"] == checked_artifact

    def verdict(self, facts: GateFacts) -> Check:
        return Check.MISSING if facts.final_matches is None else Check.PASSED if facts.final_matches else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        return "the sealed final result is this selection's" if facts.final_matches else "the sealed final result is about another selection, trial or artifact"


class FinalPerformance(Gate):
    name = "final-performance"
    hold = Outcome.HOLD_FINAL_PERFORMANCE
    definition = (
        "when the contract pins selection.final_performance_margin, the winner's final miss-cost does not exceed the baseline's by more than it; "
        "otherwise the final result is reported and decides nothing"
    )
    lift = f"{DECIDE}; the final partition is never read again"

    def rule(self, facts: GateFacts) -> str:
        margin = None if facts.final is None else facts.final.margin
        return self.definition + ("" if facts.final is None else " (not pinned)" if margin is None else f" ({margin:g})")

    def verdict(self, facts: GateFacts) -> Check:
        if facts.final is None:
            return Check.MISSING
        return Check.PASSED if facts.final.within else Check.FAILED

    def found(self, facts: GateFacts) -> str:
        assert facts.final is not None
        return f"final miss-cost {facts.final.describe()}"


GATES: tuple[Gate, ...] = (Lineage(), Reproducible(), Parity(), Performance(), Slices(), Final(), FinalPerformance())  # in the order a hold is named
BEFORE_FINAL: tuple[Gate, ...] = GATES[:5]  # what a selection must clear before the final partition may be read


def judge(facts: GateFacts, gates: tuple[Gate, ...] = GATES) -> tuple[Judgement, ...]:
    """Each gate's judgement, in ``GATES`` order."""
    return tuple(gate.judge(facts) for gate in gates)


def first_hold(judgements: tuple[Judgement, ...]) -> Judgement | None:
    """The first judgement that does not clear, or None."""
    return next((j for j in judgements if not j.check.clears), None)


def release_outcome(verdicts: dict[str, Check]) -> Outcome:
    """``release:registered``, or the hold of the first gate (in ``GATES`` order) that did not clear."""
    for gate in GATES:
        if not Check(verdicts[gate.name]).clears:
            return gate.hold
    return Outcome.RELEASE_REGISTERED
