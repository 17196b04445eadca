"""Every governance outcome as one type: ``admit``, ``reject:<field>``, ``hold:<why>``,
``evaluate:<what>`` and ``release:<what>``, parsed and printed here and nowhere else.

An outcome is what a decision says (admission, the worker's check, a budget, a selection's
disposition, the release gate). Commands print it as the first line of stdout, and a refusal
(``reject`` or ``hold``) exits 3, so scripts can match on the line and on the code.

Must not: decide anything; the decisions (``admission``, ``budget``, ``selection.disposition``,
``release.packet``) return one of these.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import ClassVar

from parcel_hpc.errors import ParcelError

EXIT_REFUSED = 3  # GovernanceRefusal's exit code: a reject or a hold

_WHAT = re.compile(r"[a-z0-9][a-z0-9_-]*")


class OutcomeKind(enum.Enum):
    ADMIT = "admit"  # the trial may run
    REJECT = "reject"  # refused for good: something differs from the contract
    HOLD = "hold"  # refused until a person acts: a budget, an invalid winner, a failed gate
    EVALUATE = "evaluate"  # the selection may read the protected final partition, once
    RELEASE = "release"  # the release registered its artifact


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    what: str = ""  # after the colon: the field that differs, why it holds; "" for admit only

    ADMIT: ClassVar[Outcome]
    HOLD_BUDGET: ClassVar[Outcome]
    HOLD_INVALID_WINNER: ClassVar[Outcome]
    HOLD_SLICE_QUALITY: ClassVar[Outcome]
    HOLD_PERFORMANCE: ClassVar[Outcome]
    HOLD_SERVING_PARITY: ClassVar[Outcome]
    HOLD_FINAL_NOT_EVALUATED: ClassVar[Outcome]
    HOLD_FINAL_PERFORMANCE: ClassVar[Outcome]
    HOLD_SYSTEMATIC_FAILURE: ClassVar[Outcome]
    HOLD_NO_RESULT: ClassVar[Outcome]
    EVALUATE_FINAL: ClassVar[Outcome]
    RELEASE_REGISTERED: ClassVar[Outcome]
    REJECT_REGISTRY_ENTRY: ClassVar[Outcome]
    REJECT_FINAL_PARTITION: ClassVar[Outcome]

    def __post_init__(self) -> None:
        if (self.kind is OutcomeKind.ADMIT) != (self.what == ""):
            raise ValueError(f"{self.kind.value} {'takes no' if self.kind is OutcomeKind.ADMIT else 'needs a'} reason after the colon, not {self.what!r}")
        if self.what and not _WHAT.fullmatch(self.what):
            raise ValueError(f"outcome reason {self.what!r} is not lower-case letters, digits, '_' and '-'")

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.what}" if self.what else self.kind.value

    @classmethod
    def parse(cls, text: object) -> Outcome:
        """The outcome a token names (as printed and journaled); ValueError for anything else."""
        if isinstance(text, Outcome):
            return text
        word, _, what = str(text).partition(":")
        try:
            return cls(OutcomeKind(word), what)
        except ValueError:
            raise ValueError(f"{text!r} is not an outcome (admit, reject:<field>, hold:<why>, evaluate:<what>, release:<what>)") from None

    @classmethod
    def reject(cls, what: str) -> Outcome:
        return cls(OutcomeKind.REJECT, what)

    @classmethod
    def hold(cls, what: str) -> Outcome:
        return cls(OutcomeKind.HOLD, what)

    @property
    def is_admit(self) -> bool:
        return self.kind is OutcomeKind.ADMIT

    @property
    def is_reject(self) -> bool:
        return self.kind is OutcomeKind.REJECT

    @property
    def is_refusal(self) -> bool:
        """A reject or a hold: the command stops, and exits 3."""
        return self.kind in (OutcomeKind.REJECT, OutcomeKind.HOLD)

    @property
    def is_decidable(self) -> bool:
        """A hold a documented decision (``parcel-hpc decide --accept``, who and why) may lift: a
        trade a team can knowingly make, never one about whether the result is real."""
        return self in _DECIDABLE

    @property
    def exit_code(self) -> int:
        return EXIT_REFUSED if self.is_refusal else 0


Outcome.ADMIT = Outcome(OutcomeKind.ADMIT)
Outcome.HOLD_BUDGET = Outcome.hold("budget")
Outcome.HOLD_INVALID_WINNER = Outcome.hold("invalid-winner")
Outcome.HOLD_SLICE_QUALITY = Outcome.hold("slice-quality")
Outcome.HOLD_PERFORMANCE = Outcome.hold("performance")  # worse than the approved baseline on validation, beyond the pinned margin
Outcome.HOLD_SERVING_PARITY = Outcome.hold("serving-parity")
Outcome.HOLD_FINAL_NOT_EVALUATED = Outcome.hold("final-not-evaluated")
Outcome.HOLD_FINAL_PERFORMANCE = Outcome.hold("final-performance")  # the contract's final-partition rule did not hold
Outcome.HOLD_SYSTEMATIC_FAILURE = Outcome.hold("systematic-failure")  # the first trials all failed alike: dispatch stopped
Outcome.HOLD_NO_RESULT = Outcome.hold("no-result")  # a launch ended with no completed trial in its search
Outcome.EVALUATE_FINAL = Outcome(OutcomeKind.EVALUATE, "final-holdout")
Outcome.RELEASE_REGISTERED = Outcome(OutcomeKind.RELEASE, "registered")
Outcome.REJECT_REGISTRY_ENTRY = Outcome.reject("registry-entry")  # a registry entry that is not this selection's, or not its bytes
Outcome.REJECT_FINAL_PARTITION = Outcome.reject("final_partition")  # trainer code reached for the protected files, or the fence could not hold them

_DECIDABLE = frozenset((Outcome.HOLD_PERFORMANCE, Outcome.HOLD_SLICE_QUALITY, Outcome.HOLD_FINAL_PERFORMANCE))


class GovernanceRefusal(ParcelError):
    """A governance decision that stops the command: the outcome string is the first thing printed
    (``errors.exit_on_error`` prints the ``headline``)."""

    exit_code = EXIT_REFUSED

    def __init__(self, outcome: Outcome | str, detail: str = "") -> None:
        self.outcome = Outcome.parse(outcome)  # a token from a user's code too; anything else is a ValueError
        self.detail = detail
        self.headline = str(self.outcome)
        super().__init__(f"{self.outcome}: {detail}" if detail else str(self.outcome))
