"""The search report's figures as typed values (pure): each trial's result (marked where it was
resumed within a declared tolerance), its own metrics and milestone curve,
each attempt's spend, queue wait, duration and cause, and what the page derives from them (the
best-so-far history, counts by state and by cause).

Built from the ledger's records and events (``facts_of``); hours are the search's spend
(``accounting.spend.attempt_spend``) and queue waits ``ledger.summary.queue_waits``, so the report
shows what ``status`` and ``export`` show. Must not read files (``commands/report.py`` does) or
plot (``plots.py`` does).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parcel_hpc.accounting.spend import Hours, attempt_spend
from parcel_hpc.budget import Hold, ReservationKey
from parcel_hpc.ledger import Cause, Ended, Event, MetricResume, TrialRecord, TrialState
from parcel_hpc.ledger.records import counted_milestones
from parcel_hpc.ledger.states import AttemptEnd
from parcel_hpc.ledger.summary import count_states, queue_waits

Point = tuple[int, float]  # (step, validation miss-cost)


@dataclass(frozen=True)
class TrialFacts:
    trial_id: str
    state: TrialState
    params: Mapping[str, Any]
    metric: float | None = None  # a completed trial's validation miss-cost (lower is better)
    ended: float | None = None  # when it finished: its last attempt's end (epoch s); None while it runs or if none ran
    curve: tuple[Point, ...] = ()  # every milestone it reported (and its final step), by step
    pruned_at: Point | None = None  # the milestone that pruned it
    metric_resume: MetricResume = MetricResume.UNINTERRUPTED  # how its metric stands against an uninterrupted run's
    train: Mapping[str, float] = field(default_factory=dict)  # the trainer's own metrics at its last validated step

    def __post_init__(self) -> None:
        if (self.state is TrialState.COMPLETED) != (self.metric is not None and math.isfinite(self.metric)):
            raise ValueError(f"{self.trial_id}: a completed trial, and only one, carries a finite metric ({self.state.value}, {self.metric!r})")
        if self.pruned_at is not None and self.state is not TrialState.PRUNED:
            raise ValueError(f"{self.trial_id}: only a pruned trial has the milestone that pruned it ({self.state.value})")
        if self.ended is not None and not self.state.is_finished():
            raise ValueError(f"{self.trial_id}: a {self.state.value} trial has not finished")
        if [s for s, _ in self.curve] != sorted({s for s, _ in self.curve}):
            raise ValueError(f"{self.trial_id}: a curve has one value per step, in order of steps")


@dataclass(frozen=True)
class AttemptFacts:
    trial_id: str
    number: int
    spent: Hours  # what it used, as the search's spend counts it (nothing yet while it runs)
    ended: float | None = None  # epoch s; None while it runs
    cause: Cause | None = None  # why it ended without a plain result
    queue_wait_s: float | None = None  # from its job's submission (or requeue) to its start
    duration_s: float | None = None  # its start to its end


@dataclass(frozen=True)
class SearchFacts:
    name: str  # the search's revision
    space: Mapping[str, Mapping[str, Any]]  # the normalized space the contract pins (``propose.space``)
    trials: tuple[TrialFacts, ...]
    attempts: tuple[AttemptFacts, ...]
    spend_line: str = ""  # the search's spend, as every command prints it (``Spend.line``)

    @property
    def uses_gpus(self) -> bool:
        return any(a.spent.gpu_hours > 0 for a in self.attempts)

    @property
    def unfinished(self) -> int:
        return sum(not t.state.is_finished() for t in self.trials)

    @property
    def completed(self) -> tuple[TrialFacts, ...]:
        return tuple(t for t in self.trials if t.state is TrialState.COMPLETED)

    @property
    def ranked(self) -> tuple[TrialFacts, ...]:
        """Every trial: the completed ones best first, then the rest by id."""
        return tuple(sorted(self.completed, key=lambda t: (t.metric, t.trial_id))) + tuple(t for t in self.trials if t.state is not TrialState.COMPLETED)

    @property
    def train_names(self) -> tuple[str, ...]:
        """The names of the trainers' own metrics any trial reported, in order."""
        return tuple(sorted({name for t in self.trials for name in t.train}))

    @property
    def best(self) -> TrialFacts | None:
        """The completed trial with the lowest metric (ties: the first by id), as ``ledger.summary.best_completed``."""
        return min(self.completed, key=lambda t: (t.metric, t.trial_id), default=None)


@dataclass(frozen=True)
class HistoryPoint:
    """A finished trial, in the order trials finished."""

    trial_id: str
    n: int  # its place among the finished trials, from 1
    spent: Hours  # what every attempt that had ended by then had used
    metric: float | None  # its own (completed trials only)
    best: float | None  # the lowest metric of the trials finished so far (None before the first completed one)


def facts_of(
    name: str,
    space: Mapping[str, Mapping[str, Any]],
    trials: Sequence[tuple[TrialRecord, Sequence[Event]]],
    holds: Mapping[ReservationKey, Hold],
    spend_line: str = "",
) -> SearchFacts:
    """The report's values from each trial's record and the events it was folded from, and the
    budget journal's holds."""
    return SearchFacts(
        name,
        space,
        tuple(trial_facts(r, events) for r, events in trials),
        tuple(a for r, events in trials for a in attempt_facts(r, events, holds)),
        spend_line,
    )


def trial_facts(record: TrialRecord, events: Sequence[Event]) -> TrialFacts:
    """``events`` in the order ``fold`` reads them (``read_events``'): a step reported again by a
    resumed attempt keeps its latest value."""
    # A diverged step's NaN or inf has no place on an axis: the trial's state and cause say it.
    curve = {m.step: m.value for _, m in counted_milestones(record, events) if math.isfinite(m.value)}
    # A pruned trial's last attempt pruned it (a quarantined attempt is never its last).
    pruned = [
        (e.data.milestone, e.data.value)
        for e in events
        if isinstance(e.data, Ended)
        and e.data.how is AttemptEnd.PRUNED
        and e.data.milestone is not None
        and e.data.value is not None
        and math.isfinite(e.data.value)
    ]
    return TrialFacts(
        record.trial_id,
        record.state,
        dict(record.spec.params),
        record.metric,
        record.ended_at,
        tuple(sorted(curve.items())),
        pruned[-1] if pruned and record.state is TrialState.PRUNED else None,
        record.metric_resume,
        dict(record.train_metrics),
    )


def attempt_facts(record: TrialRecord, events: Sequence[Event], holds: Mapping[ReservationKey, Hold]) -> tuple[AttemptFacts, ...]:
    return tuple(
        AttemptFacts(
            record.trial_id,
            a.number,
            attempt_spend(record, a, holds).used,
            a.ended,
            a.cause,
            wait,
            end - a.started if a.started is not None and (end := a.counted_end()) is not None else None,
        )
        for a, wait in zip(record.attempts, queue_waits(record, events))
    )


def history(facts: SearchFacts) -> tuple[HistoryPoint, ...]:
    """The best-so-far metric as trials finished, against the hours spent by then."""
    finished = sorted((t for t in facts.trials if t.ended is not None), key=lambda t: (t.ended, t.trial_id))
    spends = sorted(((a.ended, a.spent) for a in facts.attempts if a.ended is not None), key=lambda e: e[0])
    out, best, spent, i = [], None, Hours(), 0
    for n, t in enumerate(finished, 1):
        while i < len(spends) and spends[i][0] <= t.ended:  # type: ignore[operator]  # ``finished`` has an end
            spent += spends[i][1]
            i += 1
        if t.metric is not None:
            best = t.metric if best is None else min(best, t.metric)
        out.append(HistoryPoint(t.trial_id, n, spent, t.metric, best))
    return tuple(out)


def state_counts(facts: SearchFacts) -> dict[TrialState, int]:
    """The trials in each state that has any, in the states' order."""
    return {TrialState(s): n for s, n in count_states(t.state for t in facts.trials).items() if n}


def cause_counts(facts: SearchFacts) -> dict[Cause, int]:
    """Attempts by why they ended without a plain result, the commonest first."""
    counts = Counter(a.cause for a in facts.attempts if a.cause is not None)
    order = {c: i for i, c in enumerate(Cause)}
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], order[kv[0]])))
