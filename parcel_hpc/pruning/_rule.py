"""The milestone stop rule: pure values in, a frozen ``PruneDecision`` out.

Owns ``PruneAction``, ``PruneDecision`` and the pruners (``AsyncSuccessiveHalving``, ``NopPruner``).
Must not touch files, read the environment or decide which peers are valid: the caller (the
``MilestoneStore``) hands in the peer values it saw and the time.

The rule (asynchronous successive halving, LOWER value is better), for a trial reporting ``value``
at step ``s`` with peer values ``peers`` (other trials' values at the SAME milestone ``s``):

1. ``s`` not in ``milestones``            -> NOT_A_MILESTONE (no peers consulted, never prunes).
2. ``s`` is the last milestone            -> FINAL (the trial has finished; no peers consulted).
3. ``len(peers) < min_peers``             -> TOO_FEW_PEERS (continue; the peers seen are recorded).
4. otherwise, with ``n = len(peers) + 1`` (the trial itself counts) and ``keep = ceil(n / eta)``,
   ``threshold`` is the ``keep``-th smallest of the ``n`` values (the trial's own value included):
   CONTINUE iff ``value <= threshold``, else PRUNE.

A K-fold trial (its fold runs in turn, fold 0 first) is compared at milestone ``m`` of fold run ``f``
on the mean of its values at ``m`` over folds ``0..f`` (``value_over_folds``), with peers that
reported at the same ``(f, m)``: every value compared is a mean over the same folds at the same
step, so a trial is never judged on a fold its peers lacked, nor its peers on one it lacked. Paired,
as Optuna's WilcoxonPruner pairs per-instance values, but by fold index rather than a test over the
instances: with K of 3 to 10 folds a signed-rank test has too few pairs to reject at any usual level
until the last folds, while successive halving over the running mean prunes from fold 0 on.

Equivalently: a trial is pruned iff at least ``keep`` of its peers are STRICTLY better. Ties never
prune: every trial whose value equals the threshold continues, so more than ``keep`` trials may go
on, and the best value at a milestone (ties included) always continues. ``eta`` is the reduction
factor. The trial's own entry in ``peers``, if the caller left one in, is ignored.
"""

from __future__ import annotations

import enum
import math
import time as _time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parcel_hpc.errors import CorruptRecord, ParcelError, UsageError
from parcel_hpc.governance.admission import check_trial_id

# Trial ids name files (<trial>.json, <trial>.invalid/): no dots, slashes or leading dashes.


class PruneAction(enum.Enum):
    CONTINUE = "continue"
    PRUNE = "prune"
    NOT_A_MILESTONE = "not_a_milestone"
    TOO_FEW_PEERS = "too_few_peers"
    FINAL = "final"  # the last milestone: the trial is done, nothing to stop

    @property
    def stops_trial(self) -> bool:
        return self is PruneAction.PRUNE

    @property
    def consults_peers(self) -> bool:
        """Whether the decision looked at peer values (and so records them)."""
        return self in (PruneAction.CONTINUE, PruneAction.PRUNE, PruneAction.TOO_FEW_PEERS)


def check_step(step: object, what: str = "step") -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UsageError(f"{what} {step!r} must be a non-negative integer training step")
    return step


def check_value(value: object, what: str = "value") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{what} {value!r} must be a finite number; report a diverged trial as failed instead of pruning it")
    return float(value)


def value_over_folds(mean_before: float | None, fold: int, value: float) -> float | None:
    """The value a K-fold trial is compared on at one milestone of fold run ``fold``: the mean of its
    values there over folds ``0..fold``, from ``mean_before`` (that mean over folds ``0..fold-1``, as
    it was compared at the same milestone of the fold before) and this fold's ``value``. None when a
    later fold has no ``mean_before`` (its earlier fold's report was withdrawn): then it is not compared."""
    check_step(fold, "fold")
    value = check_value(value)
    if fold == 0:
        return value
    if mean_before is None:
        return None
    return (check_value(mean_before, "mean_before") * fold + value) / (fold + 1)


def check_milestones(milestones: object) -> tuple[int, ...]:
    ms = tuple(milestones) if isinstance(milestones, (list, tuple)) else None
    if not ms or any(isinstance(m, bool) or not isinstance(m, int) or m <= 0 for m in ms) or list(ms) != sorted(set(ms)):
        raise UsageError(f"milestones {milestones!r} must be strictly increasing positive steps, e.g. (10, 20, 41, 82)")
    return ms


@dataclass(frozen=True)
class PruneDecision:
    """One decision for one (trial, milestone), with everything needed to recompute it."""

    trial_id: str
    milestone: int  # the step the value was reported at (may be off-milestone: NOT_A_MILESTONE)
    value: float  # the trial's own metric at ``milestone``; lower is better
    action: PruneAction
    peers: tuple[tuple[str, float], ...]  # (trial id, value) of the peers consulted, sorted by id
    threshold: float | None  # keep-th smallest value; None when no threshold was computed
    keep: int | None  # ceil(n / reduction_factor), n = peers + 1; None when not computed
    reduction_factor: int | None  # eta; None for a pruner without one
    min_peers: int | None  # peers needed before anything is pruned; None for a pruner without one
    pruner: str  # which rule decided ("asha", "nop")
    time: float  # seconds since the epoch when the decision was made
    _peer_map: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            check_trial_id(self.trial_id)
            check_step(self.milestone, "milestone")
            object.__setattr__(self, "value", check_value(self.value))
            object.__setattr__(self, "time", check_value(self.time, "time"))
            peers = tuple((check_trial_id(t), check_value(v, f"peer {t} value")) for t, v in self.peers)
        except UsageError as exc:
            raise ParcelError(f"invalid PruneDecision: {exc}") from None
        object.__setattr__(self, "peers", peers)
        ids = [t for t, _ in peers]
        if ids != sorted(set(ids)):
            _bad("peers must be sorted by trial id without repeats")
        if self.trial_id in ids:
            _bad(f"trial {self.trial_id} cannot be its own peer")
        if not isinstance(self.action, PruneAction):
            _bad(f"action {self.action!r} is not a PruneAction")
        if self.threshold is not None:
            object.__setattr__(self, "threshold", check_value(self.threshold, "threshold"))
        if not self.action.consults_peers and (peers or self.threshold is not None):
            _bad(f"{self.action.value} consults no peers and has no threshold")
        if self.action is PruneAction.TOO_FEW_PEERS and self.threshold is not None:
            _bad("too_few_peers has no threshold")
        if self.action is PruneAction.PRUNE and (self.threshold is None or not self.value > self.threshold):
            _bad(f"prune needs a threshold below the value {self.value}")
        if self.action is PruneAction.CONTINUE and self.threshold is not None and not self.value <= self.threshold:
            _bad(f"continue with threshold {self.threshold} needs value {self.value} <= threshold")
        object.__setattr__(self, "_peer_map", dict(peers))

    @property
    def peer_values(self) -> dict[str, float]:
        return dict(self._peer_map)

    @property
    def peer_ids(self) -> frozenset[str]:
        return frozenset(self._peer_map)

    def to_json(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "milestone": self.milestone,
            "value": self.value,
            "action": self.action.value,
            "peers": dict(self.peers),
            "threshold": self.threshold,
            "keep": self.keep,
            "reduction_factor": self.reduction_factor,
            "min_peers": self.min_peers,
            "pruner": self.pruner,
            "time": self.time,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "<decision>") -> PruneDecision:
        try:
            return cls(
                trial_id=obj["trial_id"],
                milestone=obj["milestone"],
                value=obj["value"],
                action=PruneAction(obj["action"]),
                peers=tuple(sorted(obj["peers"].items())),
                threshold=obj["threshold"],
                keep=obj["keep"],
                reduction_factor=obj["reduction_factor"],
                min_peers=obj["min_peers"],
                pruner=obj["pruner"],
                time=obj["time"],
            )
        except (KeyError, TypeError, ValueError, AttributeError, ParcelError) as exc:
            raise CorruptRecord(f"{where} is not a prune decision ({exc}); move it aside and rerun") from None


def _bad(msg: str) -> None:
    raise ParcelError(f"invalid PruneDecision: {msg}")


class Pruner(ABC):
    """One extension point, as Optuna's ``BasePruner.prune``: a pure decision from plain values."""

    milestones: tuple[int, ...]

    @abstractmethod
    def decide(self, trial_id: str, milestone: int, value: float, peers: Mapping[str, float], *, now: float | None = None) -> PruneDecision:
        """Decide for ``trial_id`` reporting ``value`` at step ``milestone`` given same-milestone ``peers``.

        ``now`` stamps the decision (seconds since the epoch); None reads the wall clock here, at the edge.
        """


class AsyncSuccessiveHalving(Pruner):
    """Asynchronous successive halving; the exact rule, ties included, is in the module docstring."""

    name = "asha"

    def __init__(self, milestones: tuple[int, ...], reduction_factor: int = 3, min_peers: int = 4) -> None:
        self.milestones = check_milestones(milestones)
        if isinstance(reduction_factor, bool) or not isinstance(reduction_factor, int) or reduction_factor < 2:
            raise UsageError(f"reduction_factor {reduction_factor!r} must be an integer >= 2 (3 keeps the best third)")
        if isinstance(min_peers, bool) or not isinstance(min_peers, int) or min_peers < 1:
            raise UsageError(f"min_peers {min_peers!r} must be an integer >= 1 (a lone trial cannot be ranked)")
        self.reduction_factor = reduction_factor
        self.min_peers = min_peers

    def __repr__(self) -> str:
        return f"AsyncSuccessiveHalving(milestones={self.milestones}, reduction_factor={self.reduction_factor}, min_peers={self.min_peers})"

    def decide(self, trial_id: str, milestone: int, value: float, peers: Mapping[str, float], *, now: float | None = None) -> PruneDecision:
        check_trial_id(trial_id)
        check_step(milestone, "milestone")
        value = check_value(value)
        now = _time.time() if now is None else now
        common: dict[str, Any] = dict(
            trial_id=trial_id, milestone=milestone, value=value, reduction_factor=self.reduction_factor, min_peers=self.min_peers, pruner=self.name, time=now
        )
        if milestone not in self.milestones:
            return PruneDecision(action=PruneAction.NOT_A_MILESTONE, peers=(), threshold=None, keep=None, **common)
        if milestone == self.milestones[-1]:
            return PruneDecision(action=PruneAction.FINAL, peers=(), threshold=None, keep=None, **common)
        seen = tuple(sorted((t, check_value(v, f"peer {t} value")) for t, v in peers.items() if t != trial_id))
        if len(seen) < self.min_peers:
            return PruneDecision(action=PruneAction.TOO_FEW_PEERS, peers=seen, threshold=None, keep=None, **common)
        ranked = sorted([value, *(v for _, v in seen)])
        keep = -(-len(ranked) // self.reduction_factor)  # ceil without floats
        threshold = ranked[keep - 1]
        action = PruneAction.CONTINUE if value <= threshold else PruneAction.PRUNE
        return PruneDecision(action=action, peers=seen, threshold=threshold, keep=keep, **common)


class NopPruner(Pruner):
    """Never prunes; still says NOT_A_MILESTONE and FINAL so records read the same as under ASHA."""

    name = "nop"

    def __init__(self, milestones: tuple[int, ...]) -> None:
        self.milestones = check_milestones(milestones)

    def __repr__(self) -> str:
        return f"NopPruner(milestones={self.milestones})"

    def decide(self, trial_id: str, milestone: int, value: float, peers: Mapping[str, float], *, now: float | None = None) -> PruneDecision:
        check_trial_id(trial_id)
        check_step(milestone, "milestone")
        if milestone not in self.milestones:
            action = PruneAction.NOT_A_MILESTONE
        elif milestone == self.milestones[-1]:
            action = PruneAction.FINAL
        else:
            action = PruneAction.CONTINUE
        return PruneDecision(
            trial_id=trial_id,
            milestone=milestone,
            value=check_value(value),
            action=action,
            peers=(),
            threshold=None,
            keep=None,
            reduction_factor=None,
            min_peers=None,
            pruner=self.name,
            time=_time.time() if now is None else now,
        )
