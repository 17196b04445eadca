"""The one decision of a selection (pure), with the project card's semantics:

hold:budget            the budget is not positive, or the search holds more trials than it
hold:invalid-winner    the selected trial is not a completed trial with clean lineage, or its
                       rerun is missing or outside the tolerance
hold:slice-quality     its slice gate failed and no documented decision lifted it
evaluate:final-holdout otherwise: the final partition may be read, once
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.selection.candidates import Entry


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
    if chosen is None:
        problems = next((e.problems for e in entries if e.trial_id == selected), ("not among the completed trials",))
        return Verdict(Outcome.HOLD_INVALID_WINNER, tuple(f"{selected}: {p}" for p in problems))
    if rerun is None or not rerun.within:
        return Verdict(Outcome.HOLD_INVALID_WINNER, (f"rerun of {selected}: {rerun.describe() if rerun else 'not run yet'}",))
    if slice_gate_passed is None:
        return Verdict(Outcome.HOLD_SLICE_QUALITY, (f"{selected}: no slice report",))
    if not slice_gate_passed and not decided:
        return Verdict(Outcome.HOLD_SLICE_QUALITY, (f"{selected}: the slice gate failed; a documented quality decision (parcel-hpc decide) can lift it",))
    return Verdict(Outcome.EVALUATE_FINAL, (f"{selected}: decided despite its slice gate" if not slice_gate_passed else f"{selected}: every check passed",))
