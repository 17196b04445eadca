"""Milestone reports and prune decisions kept in a search directory on a shared filesystem.

Owns this layout (every file create-exclusive, first writer wins, never rewritten)::

    <search_dir>/milestones/milestones.json         milestone steps the directory was started with
    <search_dir>/milestones/<m>/<trial>.json        a trial's first report at milestone <m>
    <search_dir>/off_milestone/<step>/<trial>.json  a report at a step that is no milestone: never a peer
    <search_dir>/prune_decisions/<m>/<trial>.json   the one decision for (<trial>, <m>)
    <search_dir>/prune_decisions/<m>/<trial>.invalid/<peer>.json
                                                    that decision used <peer>, later quarantined
    <search_dir>/prune_excluded/<trial>.json        <trial> was quarantined: never a peer again
    <search_dir>/folds/<f>/...                      the same layout for fold run <f> >= 1 of K-fold trials
                                                    (fold 0's is the search's own: ``of_fold``)

Must not decide anything itself (the ``Pruner`` does) nor know why a trial was quarantined (the
ledger does; it calls ``invalidate_uses_of``). No server, no lock: NFS gives us ``link(2)`` failing
with EEXIST atomically, and that is the only primitive used (``fsio.create_exclusive``).

Guarantees under concurrency (any number of processes on any number of nodes):
- A report that ``report()`` returned from is durable (file and directory fsynced) and whole, and
  exactly one report exists per (trial, milestone): a requeued attempt re-reporting keeps the FIRST
  value. A report is never lost: every decision whose peer listing starts after ``report()`` returned
  sees it (on NFS, once the client's directory cache has revalidated: mount with ``lookupcache=positive``
  or a short ``acdirmax`` if peers must show up within seconds).
- At most one decision is recorded per (trial, milestone), and every ``decide()`` for that pair, in
  any process, at any time, returns that recorded decision: a racer that loses the create reads and
  returns the winner's.
- A decision is NOT a consistent snapshot across trials. Its peer set is whatever reports were
  visible when it listed them (two trials reporting at once may each miss the other): that is the
  asynchrony ASHA accepts. The exact peer set is recorded with the decision, so
  ``pruner.decide(d.trial_id, d.milestone, d.value, d.peer_values, now=d.time) == d`` always holds.
- Invalidation closes its race with ``decide()``: the quarantine marker is written before the scan
  of decisions, and ``decide()`` re-reads the markers after recording, so a decision that used a
  quarantined peer is marked by one side or the other.
"""

from __future__ import annotations

import os
import time as _time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.admission import check_trial_id
from parcel_hpc.pruning._rule import PruneDecision, Pruner, check_milestones, check_step, check_value


@dataclass(frozen=True)
class MilestoneReport:
    trial_id: str
    milestone: int | None  # the milestone this value counts at; None when ``step`` is no milestone
    value: float  # metric at ``step``; lower is better
    step: int  # the training step the value was measured at
    attempt: int  # the SLURM attempt (requeue count) that reported it
    time: float  # seconds since the epoch

    def __post_init__(self) -> None:
        check_trial_id(self.trial_id)
        check_step(self.step)
        check_step(self.attempt, "attempt")
        object.__setattr__(self, "value", check_value(self.value))
        object.__setattr__(self, "time", check_value(self.time, "time"))
        if self.milestone is not None and self.milestone != self.step:
            raise UsageError(f"report at step {self.step} cannot count at milestone {self.milestone}")

    def to_json(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "milestone": self.milestone, "value": self.value, "step": self.step, "attempt": self.attempt, "time": self.time}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> MilestoneReport:
        try:
            return cls(**{k: obj[k] for k in ("trial_id", "milestone", "value", "step", "attempt", "time")})
        except (KeyError, TypeError, UsageError) as exc:
            raise CorruptRecord(f"{where} is not a milestone report ({exc}); move it aside and rerun") from None


@dataclass(frozen=True)
class Invalidation:
    """A recorded decision used ``invalid_peer`` as a peer, and that trial was later quarantined."""

    trial_id: str  # whose decision is invalid
    milestone: int
    invalid_peer: str
    reason: str  # why ``invalid_peer`` was quarantined (the first reason given)
    time: float  # seconds since the epoch when the invalidation was recorded

    def to_json(self) -> dict[str, Any]:
        return {"trial_id": self.trial_id, "milestone": self.milestone, "invalid_peer": self.invalid_peer, "reason": self.reason, "time": self.time}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Invalidation:
        try:
            return cls(**{k: obj[k] for k in ("trial_id", "milestone", "invalid_peer", "reason", "time")})
        except (KeyError, TypeError) as exc:
            raise CorruptRecord(f"{where} is not an invalidation record ({exc}); move it aside and rerun") from None


@dataclass(frozen=True)
class RecordedDecision:
    decision: PruneDecision
    invalidations: tuple[Invalidation, ...]  # sorted by invalid peer; empty while the decision stands

    @property
    def valid(self) -> bool:
        return not self.invalidations


class MilestoneStore:
    """Reports and decisions of one search, shared by every trial process through ``search_dir``."""

    def __init__(self, search_dir: str | os.PathLike, milestones: Iterable[int], clock: Callable[[], float] = _time.time, *, readonly: bool = False) -> None:
        """``readonly``: for readers (``status``), which must not write a byte, even the milestone grid."""
        self.root = Path(search_dir)
        self.milestones = check_milestones(tuple(milestones))
        self._clock = clock
        self._check_frozen_milestones(readonly)

    def of_fold(self, fold: int | None) -> MilestoneStore:
        """The store of fold run ``fold`` of K-fold trials, whose peers are the same fold's (fold 0 and a
        trial without folds, None: this one); it shares this store's milestones and clock."""
        if not fold:
            return self
        return MilestoneStore(self.root / "folds" / str(check_step(fold, "fold")), self.milestones, self._clock)

    def fold_stores(self) -> list[MilestoneStore]:
        """This store and every fold run's found beside it: what a quarantine invalidates."""
        folds = sorted(int(n) for n in fsio.names(self.root / "folds", within=self.root) if n.isdigit() and n != "0")
        return [self, *(self.of_fold(f) for f in folds)]

    # -- reports --------------------------------------------------------------------------------

    def report(self, trial_id: str, step: int, value: float, attempt: int) -> bool:
        """Record ``value`` at ``step``; True iff ``step`` is a milestone (then call ``decide``).

        Off-milestone steps go to ``off_milestone/`` and are never peers. A second report of the same
        (trial, step), e.g. from a requeued attempt, keeps the first value and changes nothing.
        """
        on = step in self.milestones
        rec = MilestoneReport(trial_id, step if on else None, value, step, attempt, self._clock())
        fsio.create_exclusive_json(self._report_path(trial_id, step, create_dir=True), rec.to_json())
        return on

    def report_of(self, trial_id: str, step: int) -> MilestoneReport | None:
        """The recorded (first) report of ``trial_id`` at ``step``, milestone or not."""
        path = self._report_path(check_trial_id(trial_id), check_step(step))
        found = self._read(path)
        if found is None:
            return None
        rec = MilestoneReport.from_json(found, str(path))
        if rec.trial_id != trial_id or rec.step != step:
            raise CorruptRecord(f"{path} holds trial {rec.trial_id} step {rec.step}; move it aside and rerun")
        return rec

    def peers(self, milestone: int, exclude: Iterable[str] = ()) -> dict[str, float]:
        """Every trial's first value at ``milestone`` visible now, minus ``exclude`` and quarantined trials."""
        if milestone not in self.milestones:
            raise UsageError(
                f"{milestone!r} is not a milestone of this search ({', '.join(map(str, self.milestones))}); values off a milestone are never peers"
            )
        skip = set(exclude) | self._excluded()
        d = self.root / "milestones" / str(milestone)
        out: dict[str, float] = {}
        for trial_id in self._json_stems(d):
            if trial_id not in skip:
                rec = self.report_of(trial_id, milestone)
                if rec is not None:
                    out[trial_id] = rec.value
        return out

    # -- decisions ------------------------------------------------------------------------------

    def decide(self, pruner: Pruner, trial_id: str, milestone: int, exclude: Iterable[str] = ()) -> PruneDecision:
        """The one decision for (``trial_id``, ``milestone``): the recorded one, else made now and recorded.

        ``exclude`` names peers that must not count (quarantined trials); trials passed to
        ``invalidate_uses_of`` are excluded as well. Requires ``report()`` first.
        """
        if tuple(pruner.milestones) != self.milestones:
            raise UsageError(
                f"{pruner!r} has milestones {tuple(pruner.milestones)} but this search dir uses "
                f"{self.milestones}; build the pruner from the search's frozen config"
            )
        path = self._decision_path(check_trial_id(trial_id), check_step(milestone, "milestone"))
        recorded = self._read_decision(path, trial_id, milestone)
        if recorded is None:
            own = self.report_of(trial_id, milestone)
            if own is None:
                raise UsageError(f"trial {trial_id} has no report at step {milestone}; call report() before decide()")
            peers = {} if milestone not in self.milestones else self.peers(milestone, exclude={*exclude, trial_id})
            made = pruner.decide(trial_id, milestone, own.value, peers, now=self._clock())
            fsio.ensure_dir(path.parent)
            fsio.create_exclusive_json(path, made.to_json())
            recorded = self._read_decision(path, trial_id, milestone)  # ours, or the racer's that won
            assert recorded is not None
        # A peer quarantined between our listing and our record: the invalidator may have scanned
        # before our decision existed, so mark it here (idempotent if it did see us).
        for peer in sorted(recorded.peer_ids & self._excluded()):
            self._mark_invalid(recorded, peer)
        return recorded

    def decision_of(self, trial_id: str, milestone: int) -> RecordedDecision | None:
        path = self._decision_path(check_trial_id(trial_id), check_step(milestone, "milestone"))
        d = self._read_decision(path, trial_id, milestone)
        return None if d is None else RecordedDecision(d, self._invalidations(path, d))

    def decisions(self, trial_id: str | None = None) -> list[RecordedDecision]:
        """Every recorded decision (of one trial, if given), sorted by (trial, milestone), with invalidations."""
        out = []
        for milestone in sorted(int(n) for n in fsio.names(self.root / "prune_decisions", within=self.root) if n.isdigit()):
            d = self.root / "prune_decisions" / str(milestone)
            for stem in self._json_stems(d):
                if trial_id is None or stem == trial_id:
                    rec = self.decision_of(stem, milestone)
                    if rec is not None:
                        out.append(rec)
        return sorted(out, key=lambda r: (r.decision.trial_id, r.decision.milestone))

    def invalidate_uses_of(self, trial_id: str, reason: str) -> list[RecordedDecision]:
        """``trial_id`` was quarantined: never use it as a peer again, and mark every recorded decision
        whose peer set contains it. Decisions are not rewritten or recomputed. Returns those decisions."""
        check_trial_id(trial_id)
        if not isinstance(reason, str) or not reason.strip():
            raise UsageError("invalidate_uses_of needs a non-empty reason (e.g. 'quarantine:nan-loss')")
        excluded = fsio.ensure_dir(self.root / "prune_excluded")
        fsio.create_exclusive_json(excluded / f"{trial_id}.json", {"trial_id": trial_id, "reason": reason, "time": self._clock()})
        hit = []
        for rec in self.decisions():
            if trial_id in rec.decision.peer_ids:
                self._mark_invalid(rec.decision, trial_id)
                hit.append(cast(RecordedDecision, self.decision_of(rec.decision.trial_id, rec.decision.milestone)))  # listed just above
        return hit

    # -- internals ------------------------------------------------------------------------------

    def _check_frozen_milestones(self, readonly: bool) -> None:
        path = self.root / "milestones" / "milestones.json"
        if readonly and not path.exists():
            return
        if not readonly:
            fsio.ensure_dir(path.parent)
            fsio.create_exclusive_json(path, {"milestones": list(self.milestones)})
        found = self._read(path)
        frozen = found.get("milestones") if isinstance(found, dict) else None
        if frozen != list(self.milestones):
            raise UsageError(
                f"{self.root} was started with milestones {frozen}, not {list(self.milestones)}; use the search's frozen config or a new search directory"
            )

    def _report_path(self, trial_id: str, step: int, create_dir: bool = False) -> Path:
        base = self.root / ("milestones" if step in self.milestones else "off_milestone") / str(step)
        if create_dir:
            fsio.ensure_dir(base)
        return base / f"{trial_id}.json"

    def _decision_path(self, trial_id: str, milestone: int) -> Path:
        return self.root / "prune_decisions" / str(milestone) / f"{trial_id}.json"

    def _read_decision(self, path: Path, trial_id: str, milestone: int) -> PruneDecision | None:
        found = self._read(path)
        if found is None:
            return None
        d = PruneDecision.from_json(found, str(path))
        if d.trial_id != trial_id or d.milestone != milestone:
            raise CorruptRecord(f"{path} holds the decision of {d.trial_id} at {d.milestone}; move it aside and rerun")
        return d

    def _excluded(self) -> set[str]:
        return set(self._json_stems(self.root / "prune_excluded"))

    def _mark_invalid(self, decision: PruneDecision, peer: str) -> None:
        marker = self.root / "prune_excluded" / f"{peer}.json"
        found = self._read(marker)
        reason = str(found.get("reason", "")) if isinstance(found, dict) else ""
        d = fsio.ensure_dir(self._invalid_dir(self._decision_path(decision.trial_id, decision.milestone)))
        inv = Invalidation(decision.trial_id, decision.milestone, peer, reason, self._clock())
        fsio.create_exclusive_json(d / f"{peer}.json", inv.to_json())

    def _read(self, path: Path) -> Any:
        """The record ``path`` of this search (read within it: no link below it is followed); None
        when it does not exist."""
        try:
            return fsio.read_json(path, within=self.root)
        except FileNotFoundError:
            return None

    def _json_stems(self, d: Path) -> list[str]:
        """Record names in ``d``, skipping create_exclusive's in-flight temp files (dot-prefixed)."""
        return sorted(n[:-5] for n in fsio.names(d, within=self.root) if n.endswith(".json") and not n.startswith(".") and "." not in n[:-5])

    @staticmethod
    def _invalid_dir(decision_path: Path) -> Path:
        return decision_path.with_name(decision_path.name[: -len(".json")] + ".invalid")

    def _invalidations(self, decision_path: Path, decision: PruneDecision) -> tuple[Invalidation, ...]:
        d = self._invalid_dir(decision_path)
        out = []
        for peer in self._json_stems(d):
            inv = Invalidation.from_json(self._read(d / f"{peer}.json"), str(d / f"{peer}.json"))
            if (inv.trial_id, inv.milestone, inv.invalid_peer) != (decision.trial_id, decision.milestone, peer):
                raise CorruptRecord(f"{d / f'{peer}.json'} does not belong to its decision; move it aside and rerun")
            out.append(inv)
        return tuple(out)
