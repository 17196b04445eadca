"""Two trials on one checkpoint prefix: quarantine both, keep every byte, rerun both cleanly.

Called by the attempt that found another trial's claim or checkpoint in its directory. Both trials
are marked quarantined (every attempt so far is tainted), the shared directory and both trials'
milestone reports are moved (never deleted) into ``<search>/quarantine/``, and every prune decision
that used either trial as a peer is marked invalid. The launcher's retry loop (or ``resubmit``)
reruns both under the same trial_ids in fresh directories.

A directory held by another search (its claim names another search id, or its checkpoint another
contract) is that search's: only this trial is quarantined, and nothing of the other's is moved or
marked. The launch refuses a ``checkpoint.dir`` in use by another search at the door
(``checkpoints.prefix``); this is the race behind it.
"""

from __future__ import annotations

import os
from pathlib import Path

from parcel_hpc import anchor, fsio
from parcel_hpc.checkpoints import claims
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import SearchDir
from parcel_hpc.pruning import MilestoneStore


def quarantine_collision(search: SearchDir, trial_id: str, attempt: int, exc: claims.CheckpointCollision) -> list[str]:
    if exc.other_search:
        return _quarantine_alone(search, trial_id, attempt, f"checkpoint prefix {exc.ckpt_dir} is held by {exc.other_search}, not this search")
    other = _other_trial(exc, trial_id)
    reason = f"checkpoint prefix {exc.ckpt_dir} shared by {trial_id}" + (f" and {other}" if other else "")
    involved = [trial_id] + ([other] if other and other != trial_id else [])
    uptos = {tid: attempt if tid == trial_id else _latest_attempt(search, tid) for tid in involved}
    # Marks first, create-exclusive: of two attempts finding the same collision, one acts.
    if not search.mark_quarantined(trial_id, uptos[trial_id], reason):
        return involved
    for tid in involved[1:]:
        search.mark_quarantined(tid, uptos[tid], reason)
    moved = ""
    try:
        moved = anchor.shown(claims.quarantine_move(exc.ckpt_dir, search.quarantine_dir, "_".join(involved), reason))
    except UsageError:
        pass  # already moved by the other trial's attempt: nothing is lost
    stores = MilestoneStore(search.path, _milestones(search)).fold_stores()
    for tid in involved:
        upto = uptos[tid]
        search.writer(tid, "quarantine").quarantined(reason, upto, moved, [t for t in involved if t != tid])
        _move_reports(search, tid, upto)
        for store in stores:
            store.invalidate_uses_of(tid, reason)
    return involved


def _quarantine_alone(search: SearchDir, trial_id: str, attempt: int, reason: str) -> list[str]:
    """This trial's attempts so far are tainted and it reruns in a directory of this search's own;
    the directory it found stays where it is, with whoever owns it."""
    if search.mark_quarantined(trial_id, attempt, reason):
        search.writer(trial_id, "quarantine").quarantined(reason, attempt, "", [])
        _move_reports(search, trial_id, attempt)
        for store in MilestoneStore(search.path, _milestones(search)).fold_stores():
            store.invalidate_uses_of(trial_id, reason)
    return [trial_id]


def _other_trial(exc: claims.CheckpointCollision, ours: str) -> str | None:
    trial = exc.their_trial
    return trial.trial_id if trial is not None and trial.trial_id != ours else None


def _latest_attempt(search: SearchDir, trial_id: str) -> int:
    if not (search.trial_dir(trial_id) / "spec.json").exists():
        return 0
    return max((a.number for a in search.record(trial_id).attempts), default=0)


def _milestones(search: SearchDir) -> tuple[int, ...]:
    return tuple(int(m) for m in search.contract()["pruner"]["milestones"])


def _move_reports(search: SearchDir, trial_id: str, upto: int) -> None:
    """Tainted reports and the trial's own prune decisions move aside, so the clean rerun starts afresh.

    (The pruning store separately keeps a quarantined trial out of every later peer set.)
    """
    dest = fsio.ensure_dir(search.quarantine_dir / "reports" / f"{trial_id}-a{upto}")
    roots = [Path(), *(Path("folds") / p.name for p in sorted((search.path / "folds").glob("[0-9]*")))]  # a K-fold trial's fold runs' stores too
    for root in roots:
        for area in ("milestones", "off_milestone", "prune_decisions"):
            for path in list((search.path / root / area).glob(f"*/{trial_id}.json")) + list((search.path / root / area).glob(f"*/{trial_id}.invalid")):
                target = fsio.ensure_dir(dest / root / area / path.parent.name) / path.name
                try:
                    os.replace(path, target)
                except FileNotFoundError:
                    pass  # moved by a concurrent quarantine of the same collision
