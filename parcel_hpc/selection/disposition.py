"""The one decision of a selection (pure), with the project card's semantics:

hold:budget            the budget is not positive, or the search holds more trials than it
hold:invalid-winner    the selected trial is not a completed trial with clean lineage, or its
                       rerun is missing or outside the tolerance
hold:slice-quality     its slice gate failed and no documented decision lifted it
evaluate:final-holdout otherwise: the final partition may be read, once
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.selection.candidates import Entry
from parcel_hpc.selection.gates import BEFORE_FINAL, GateFacts, Lineage, Reproducible, RerunCheck, Slices, first_hold


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reasons: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        """3 for a hold (printed first, with its evidence), else 0."""
        return self.outcome.exit_code


def disposition(
    n_trials: int, budget: int, entries: Sequence[Entry], selected: str, rerun: RerunCheck | None, slice_gate_passed: bool | None, decided: bool
) -> Verdict:
    """``n_trials``: trials the search holds; ``entries``: the frozen completed list."""
    if budget <= 0 or n_trials > budget:
        return Verdict(Outcome.HOLD_BUDGET, (f"the search holds {n_trials} trials, its budget is {budget}",))
    if not selected:
        return Verdict(Outcome.HOLD_INVALID_WINNER, ("no completed trial to select",))
    chosen = next((e for e in entries if e.trial_id == selected and e.lineage_ok), None)
    facts = GateFacts(lineage_as_frozen=chosen is not None, rerun=rerun, slice_gate_passed=slice_gate_passed, decided=decided)
    gate = first_hold(facts, BEFORE_FINAL)
    if isinstance(gate, Lineage):
        problems = next((e.problems for e in entries if e.trial_id == selected), ("not among the completed trials",))
        return Verdict(gate.hold, tuple(f"{selected}: {p}" for p in problems))
    if isinstance(gate, Reproducible):
        return Verdict(Reproducible.hold, (f"rerun of {selected}: {rerun.describe() if rerun else 'not run yet'}",))
    if isinstance(gate, Slices):
        if slice_gate_passed is None:
            return Verdict(gate.hold, (f"{selected}: no slice report",))
        return Verdict(gate.hold, (f"{selected}: the slice gate failed; a documented quality decision (parcel-hpc decide) can lift it",))
    return Verdict(Outcome.EVALUATE_FINAL, (f"{selected}: decided despite its slice gate" if not slice_gate_passed else f"{selected}: every check passed",))
