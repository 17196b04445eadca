"""The one decision of a selection (pure), with the project card's semantics, every gate that can
be judged on validation judged before the final partition may be read (``gates.BEFORE_FINAL``):

hold:budget            the budget is not positive, or the search holds more trials than it
hold:invalid-winner    the selected trial is not a completed trial with clean lineage, or its
                       rerun is missing or outside the tolerance
hold:serving-parity    its serving path does not give what training predicted
hold:performance       it is worse than the approved baseline on validation beyond the pinned
                       margin, and no documented decision lifted it
hold:slice-quality     its slice gate failed and no documented decision lifted it
evaluate:final-holdout otherwise: the final partition may be read, once

``after_final``: the release's view, every gate (the final ones too) judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.selection.candidates import Entry
from parcel_hpc.selection.gates import BEFORE_FINAL, GATES, Check, GateFacts, Judgement, Lineage, first_hold, judge


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reasons: tuple[str, ...]
    judgements: tuple[Judgement, ...] = ()  # every gate judged, in order ((): the budget held first)

    @property
    def exit_code(self) -> int:
        """3 for a hold (printed first, with its evidence), else 0."""
        return self.outcome.exit_code

    @property
    def holding(self) -> Judgement | None:
        """The judgement that names the hold, if a gate holds."""
        return first_hold(self.judgements)


def disposition(n_trials: int, budget: int, entries: Sequence[Entry], selected: str, facts: GateFacts, *, after_final: bool = False) -> Verdict:
    """``n_trials``: trials the search holds; ``entries``: the frozen completed list; ``facts``: the
    selected trial's evidence (``lineage_as_frozen`` is taken from ``entries`` here)."""
    if budget <= 0 or n_trials > budget:
        return Verdict(Outcome.HOLD_BUDGET, (f"the search holds {n_trials} trials, its budget is {budget}",))
    if not selected:
        return Verdict(Outcome.HOLD_INVALID_WINNER, ("no completed trial to select",))
    chosen = next((e for e in entries if e.trial_id == selected and e.lineage_ok), None)
    gates = GATES if after_final else BEFORE_FINAL
    judgements = judge(replace(facts, lineage_as_frozen=chosen is not None), gates)
    holding = first_hold(judgements)
    if holding is None:
        cleared = [f"{j.gate} decided" for j in judgements if j.check is Check.DECIDED]
        said = f"{selected}: every check passed" + (f" ({', '.join(cleared)})" if cleared else "")
        return Verdict(Outcome.RELEASE_REGISTERED if after_final else Outcome.EVALUATE_FINAL, (said,), judgements)
    if holding.gate == Lineage.name and not chosen:
        problems = next((e.problems for e in entries if e.trial_id == selected), ("not among the completed trials",))
        return Verdict(holding.hold, (*(f"{selected}: {p}" for p in problems), *holding.lines()), judgements)
    return Verdict(holding.hold, (f"{selected}: {holding.gate} check {holding.check.value}", *holding.lines()), judgements)
