"""Exclusive claims on per-trial checkpoint directories, NFS-safe, and the quarantine moves.

Owns the claim on a checkpoint directory: a chain of create-exclusive generation files
(``claim-000000.json``, ``claim-000001.json``, ...). The highest generation is the current holder;
taking over or re-entering means creating the next generation, which exactly one process can do
(``fsio.create_exclusive``: link-based, atomic on NFS). No flock, no SQLite. ``decide_claim`` is the
pure decision; ``claim_directory`` is the side-effecting edge. Also the directory moves the
lifecycle needs after a collision: ``quarantine_move`` (moves, never deletes).

Must not: read or write checkpoint files (store.py, format.py), decide trial states or write the ledger,
delete another trial's files, or read the clock, host or pid deep inside a decision.

Decision table (``decide_claim``; "same holder" = same attempt, job_id, host and pid):
    no claim                                              -> CLAIMED
    another search's claim (its search id)                -> conflict FOREIGN_SEARCH, never taken over
    other trial_id / config_hash / contract or snapshot   -> conflict (FOREIGN_*), never taken over
    same trial, another fold (a K-fold trial's fold runs)  -> conflict FOREIGN_FOLD, never taken over
    same trial, claim has a HIGHER attempt than ours      -> STALE_ATTEMPT: we are a stale duplicate
                                                             (an old array task, a resubmission that
                                                             was superseded); the newer attempt owns
                                                             the directory and we must not train
    same holder (we claim again)                          -> REENTERED, nothing written
    released by an attempt <= ours (orderly requeue)      -> REENTERED
    held by another live process (is_alive -> True)       -> LIVE_HOLDER conflict
    held by an OLDER attempt, dead or liveness unknown    -> TAKEN_OVER (it died without releasing;
                                                             SLURM only requeues an ended job)
    held by the SAME attempt elsewhere, known dead        -> TAKEN_OVER
    held by the SAME attempt elsewhere, liveness unknown  -> LIVE_HOLDER (two launches of one attempt)

A stale duplicate that is already running is fenced: ``CheckpointStore(..., claim=claim)`` checks
before every save that the claim still names this attempt and raises ``CheckpointCollision`` if not.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast

from parcel_hpc.errors import CorruptRecord, ParcelError, UsageError
from parcel_hpc.fsio import DIR_MODE, FILE_MODE, atomic_write_json, create_exclusive, ensure_dir, fsync_dir, read_json
from parcel_hpc.governance.admission import TrialIdentity, check_trial_id
from parcel_hpc.probe import local_process

CLAIM_FORMAT = "parcel_hpc.claim/1"
CLAIM_FILE_RE = re.compile(r"claim-(\d{6,})\.json")


class CheckpointCollision(ParcelError):
    """Another trial's claim or checkpoint is in our directory (a bad override), or we are stale.

    Exit 2: the cause is the configuration (two trials pointed at one prefix), not a bug.
    """

    exit_code = 2

    def __init__(self, ckpt_dir: str | os.PathLike, ours: Any, theirs: ClaimIdentity | TrialIdentity | None, reason: str) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.ours = ours
        self.theirs = theirs
        self.reason = reason
        super().__init__(
            f"checkpoint collision in {ckpt_dir}: {reason}; HINT: give every trial its own checkpoint "
            "directory (check overrides of the checkpoint prefix), then quarantine the outputs and rerun "
            "the trial in a fresh directory"
        )

    @property
    def their_trial(self) -> TrialIdentity | None:
        """The trial that holds the directory (a claim's holder or a checkpoint's header), if known."""
        return self.theirs.trial if isinstance(self.theirs, ClaimIdentity) else self.theirs

    @property
    def other_search(self) -> str:
        """The other search that holds the directory, in words; "" when the holder is of this search
        (or not known to be another's): a quarantine moves only this search's own directories."""
        theirs, ours = self.theirs, self.ours
        if isinstance(theirs, ClaimIdentity) and isinstance(ours, ClaimIdentity) and theirs.search_id and ours.search_id:
            return f"search {theirs.search_id}" if theirs.search_id != ours.search_id else ""
        mine = ours.trial if isinstance(ours, ClaimIdentity) else ours
        trial = self.their_trial
        if isinstance(mine, TrialIdentity) and trial is not None and trial.contract_digest != mine.contract_digest:
            return f"contract {trial.contract_digest}"
        return ""

    @property
    def other_fold(self) -> bool:
        """The holder is another fold run (or none) of a K-fold trial than ours: never this run's own attempt."""
        theirs, ours = self.theirs, self.ours
        return isinstance(theirs, ClaimIdentity) and isinstance(ours, ClaimIdentity) and theirs.fold != ours.fold

    @property
    def their_attempt(self) -> int | None:
        """The holder's attempt number, when the holder is a claim."""
        return self.theirs.attempt if isinstance(self.theirs, ClaimIdentity) else None


# ---------------------------------------------------------------------------- identities and records


@dataclass(frozen=True)
class ClaimIdentity:
    trial: TrialIdentity
    job_id: str  # SLURM job id (array form "123_4" allowed); "" when run locally
    attempt: int  # 1-based; increases on requeue or resubmission
    host: str  # socket.gethostname() of the claiming process
    pid: int  # os.getpid() of the claiming process
    search_id: str = ""  # the claiming search's id (identity.json); "" for a search frozen before ids
    fold: int | None = None  # the fold run of a K-fold trial that claims (each fold its own chain); None: a trial without folds

    def __post_init__(self) -> None:
        if self.fold is not None and (not isinstance(self.fold, int) or isinstance(self.fold, bool) or self.fold < 0):
            raise UsageError(f"fold={self.fold!r} must be a fold index >= 0, or None for a trial without folds")
        if not isinstance(self.trial, TrialIdentity):
            raise UsageError("ClaimIdentity.trial must be a TrialIdentity")
        missing = [name for name in TrialIdentity.CLAIM_FIELDS if not getattr(self.trial, name)]
        if missing:
            raise UsageError(f"a claim needs the trial's {', '.join(missing)}; build the identity from the frozen contract")
        # A claim is about the claim fields alone (what its file stores): compare equal on exactly those.
        object.__setattr__(self, "trial", TrialIdentity.from_claim_json(self.trial.claim_json()))
        if not isinstance(self.attempt, int) or isinstance(self.attempt, bool) or self.attempt < 1:
            raise UsageError(f"attempt={self.attempt!r} must be an int >= 1 (SLURM_RESTART_COUNT + 1 or the resubmission count)")
        if not isinstance(self.pid, int) or self.pid < 1:
            raise UsageError(f"pid={self.pid!r} must be a positive int")
        if not isinstance(self.job_id, str) or not isinstance(self.host, str) or not self.host:
            raise UsageError("job_id must be a string and host a non-empty string")

    @classmethod
    def here(cls, trial: TrialIdentity, *, job_id: str = "", attempt: int = 1, search_id: str = "", fold: int | None = None) -> ClaimIdentity:
        """This process on this host (the one place that reads them)."""
        return cls(trial, job_id, attempt, socket.gethostname(), os.getpid(), search_id, fold)

    def same_holder(self, other: ClaimIdentity | ClaimRecord) -> bool:
        return (self.attempt, self.job_id, self.host, self.pid) == (other.attempt, other.job_id, other.host, other.pid)


class ClaimState(Enum):
    HELD = "held"
    RELEASED = "released"  # the holder left in order (finished, or requeued with a handler)


@dataclass(frozen=True)
class ClaimRecord:
    """One generation of the claim chain, as stored in ``claim-<generation>.json``."""

    trial: TrialIdentity
    job_id: str
    attempt: int
    host: str
    pid: int
    time: str  # ISO-8601 UTC of the write
    state: ClaimState
    generation: int  # position in the chain; equals the number in the file name
    search_id: str = ""  # the claiming search's (ClaimIdentity.search_id)
    fold: int | None = None  # ClaimIdentity.fold

    def __post_init__(self) -> None:
        ClaimIdentity(self.trial, self.job_id, self.attempt, self.host, self.pid, self.search_id, self.fold)  # same validation
        if not isinstance(self.state, ClaimState) or not isinstance(self.generation, int) or self.generation < 0:
            raise UsageError("ClaimRecord needs a ClaimState and a generation >= 0")

    @property
    def holder(self) -> ClaimIdentity:
        return ClaimIdentity(self.trial, self.job_id, self.attempt, self.host, self.pid, self.search_id, self.fold)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.trial.claim_json(),
            "format": CLAIM_FORMAT,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "host": self.host,
            "pid": self.pid,
            "time": self.time,
            "state": self.state.value,
            "generation": self.generation,
            "search_id": self.search_id,
            **({} if self.fold is None else {"fold": self.fold}),  # a trial without folds writes the claim it always did
        }

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ClaimRecord:
        try:
            if obj["format"] != CLAIM_FORMAT:
                raise ValueError(f"format {obj['format']!r}")
            trial = TrialIdentity.from_claim_json(obj)
            return cls(
                trial,
                obj["job_id"],
                obj["attempt"],
                obj["host"],
                obj["pid"],
                obj["time"],
                ClaimState(obj["state"]),
                obj["generation"],
                obj.get("search_id", ""),
                obj.get("fold"),
            )
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            raise CorruptRecord(f"{where} is not a valid claim ({exc}); move the directory aside with quarantine_move") from None


class ClaimOutcome(Enum):
    CLAIMED = "claimed"
    REENTERED = "reentered"
    TAKEN_OVER = "taken_over"
    FOREIGN_TRIAL = "conflict:trial_id"
    FOREIGN_CONFIG = "conflict:config_hash"
    FOREIGN_SEARCH = "conflict:contract"  # same trial_id and config, another contract or snapshot
    FOREIGN_FOLD = "conflict:fold"  # the same trial's other fold run: each fold has its own chain
    STALE_ATTEMPT = "conflict:stale_attempt"
    LIVE_HOLDER = "conflict:live_holder"

    def is_conflict(self) -> bool:
        return self.value.startswith("conflict:")

    def resumes(self) -> bool:
        """Existing checkpoints in the directory are this trial's and should be resumed from."""
        return self in (ClaimOutcome.REENTERED, ClaimOutcome.TAKEN_OVER)


def decide_claim(existing: ClaimRecord | None, ours: ClaimIdentity, *, holder_alive: bool | None = None) -> ClaimOutcome:
    """Pure: what ``ours`` may do with a directory whose current claim is ``existing``.

    ``holder_alive`` is what the caller knows about ``existing``'s process: True, False, or None
    (unknown, e.g. it ran on another node). See the module docstring for the table.
    """
    if existing is None:
        return ClaimOutcome.CLAIMED
    if _other_search(existing, ours):
        return ClaimOutcome.FOREIGN_SEARCH
    field = existing.trial.mismatch(ours.trial)
    if field == "trial_id":
        return ClaimOutcome.FOREIGN_TRIAL
    if field == "config_hash":
        return ClaimOutcome.FOREIGN_CONFIG
    if field is not None:
        return ClaimOutcome.FOREIGN_SEARCH
    if existing.fold != ours.fold:
        return ClaimOutcome.FOREIGN_FOLD
    if existing.attempt > ours.attempt:
        return ClaimOutcome.STALE_ATTEMPT
    if ours.same_holder(existing) or existing.state is ClaimState.RELEASED:
        return ClaimOutcome.REENTERED
    if holder_alive is True:
        return ClaimOutcome.LIVE_HOLDER
    if existing.attempt < ours.attempt or holder_alive is False:
        return ClaimOutcome.TAKEN_OVER
    return ClaimOutcome.LIVE_HOLDER


def _other_search(existing: ClaimRecord, ours: ClaimIdentity) -> bool:
    """Both claims name their search, and not the same one (a claim from before ids names none)."""
    return bool(existing.search_id and ours.search_id and existing.search_id != ours.search_id)


def describe_conflict(outcome: ClaimOutcome, existing: ClaimRecord, ours: ClaimIdentity) -> str:
    """Pure: the one-line reason for a conflicting outcome."""
    them, us = existing.trial, ours.trial
    holder = f"attempt {existing.attempt} (job {existing.job_id or '-'}, {existing.host} pid {existing.pid})"
    if _other_search(existing, ours):
        return f"claimed by trial {them.trial_id} of search {existing.search_id}, we are trial {us.trial_id} of search {ours.search_id}"
    if outcome is ClaimOutcome.FOREIGN_TRIAL:
        return f"claimed by trial {them.trial_id}, we are trial {us.trial_id}"
    if outcome is ClaimOutcome.FOREIGN_CONFIG:
        return f"trial {us.trial_id} claimed with config {them.config_hash}, ours is {us.config_hash}"
    if outcome is ClaimOutcome.FOREIGN_SEARCH:
        field = cast(str, them.mismatch(us))  # a foreign search: some search field differs
        return f"trial {us.trial_id} claimed under {field} {getattr(them, field)}, ours is {getattr(us, field)}"
    if outcome is ClaimOutcome.FOREIGN_FOLD:
        return f"claimed by fold {existing.fold} of trial {them.trial_id}, we are its fold {ours.fold}"
    if outcome is ClaimOutcome.STALE_ATTEMPT:
        return f"a newer {holder} owns trial {us.trial_id}; this attempt {ours.attempt} is a stale duplicate and must stop"
    if outcome is ClaimOutcome.LIVE_HOLDER:
        return f"trial {us.trial_id} is held by {holder}, which is alive or cannot be checked from here"
    raise ValueError(f"{outcome} is not a conflict")


# ---------------------------------------------------------------------------- claims (side effects)


def holder_alive_locally(record: ClaimRecord) -> bool | None:
    """Default liveness probe: the holder's pid on this host; None for another host.

    A recycled pid reads as alive (a conservative conflict); a cluster caller can pass a probe that
    asks the scheduler about ``record.job_id`` instead.
    """
    return local_process(record.pid, record.host).as_bool()


@dataclass(frozen=True)
class Claim:
    ckpt_dir: Path
    outcome: ClaimOutcome  # never a conflict: conflicts raise
    record: ClaimRecord  # the current generation, naming us
    previous: ClaimRecord | None  # what was there before (None when CLAIMED)

    def verify(self) -> None:
        """Raise CheckpointCollision unless the claim still names this attempt (the fence)."""
        current = read_claim(self.ckpt_dir)
        if current is None or not self.record.holder.same_holder(current) or current.trial != self.record.trial or current.state is not ClaimState.HELD:
            theirs = current.holder if current else None
            what = (
                f"attempt {current.attempt} (job {current.job_id or '-'}, {current.host} pid {current.pid}, {current.state.value})"
                if current
                else "nobody (claim files removed)"
            )
            raise CheckpointCollision(self.ckpt_dir, self.record.holder, theirs, f"the claim moved from this attempt to {what}; this process must stop")

    def release(self, *, clock: Callable[[], float] = time.time) -> bool:
        """Mark an orderly exit so the next attempt re-enters; False if someone already took over."""
        current = read_claim(self.ckpt_dir)
        if current is None or not self.record.holder.same_holder(current) or current.state is ClaimState.RELEASED:
            return False
        nxt = ClaimRecord(
            current.trial,
            current.job_id,
            current.attempt,
            current.host,
            current.pid,
            _iso(clock()),
            ClaimState.RELEASED,
            current.generation + 1,
            current.search_id,
            current.fold,
        )
        return _create_generation(self.ckpt_dir, nxt)


def claim_directory(
    ckpt_dir: str | os.PathLike,
    identity: ClaimIdentity,
    *,
    is_alive: Callable[[ClaimRecord], bool | None] = holder_alive_locally,
    clock: Callable[[], float] = time.time,
) -> Claim:
    """Claim ``ckpt_dir`` for ``identity`` before anything is written there; raise on a conflict.

    Each transition creates the next claim generation exclusively; a process that loses that race
    reads the winner's record and decides again, so exactly one process holds the directory.
    """
    ckpt_dir = ensure_dir(ckpt_dir)
    current = read_claim(ckpt_dir)
    for _ in range(1000):  # each lap means another process won a generation; bounded for safety
        alive = is_alive(cast(ClaimRecord, current)) if _liveness_matters(current, identity) else None  # _liveness_matters: current is a claim
        outcome = decide_claim(current, identity, holder_alive=alive)
        if outcome.is_conflict():
            assert current is not None  # decide_claim: an unclaimed directory is never a conflict
            raise CheckpointCollision(ckpt_dir, identity, current.holder, describe_conflict(outcome, current, identity))
        if current is not None and identity.same_holder(current) and current.state is ClaimState.HELD:
            return Claim(ckpt_dir, outcome, current, current)  # idempotent: already ours
        gen = 0 if current is None else current.generation + 1
        mine = ClaimRecord(
            identity.trial,
            identity.job_id,
            identity.attempt,
            identity.host,
            identity.pid,
            _iso(clock()),
            ClaimState.HELD,
            gen,
            identity.search_id,
            identity.fold,
        )
        if _create_generation(ckpt_dir, mine):
            return Claim(ckpt_dir, outcome, mine, current)
        current = read_generation(ckpt_dir, gen)  # the winner's record, read by name (fresh on NFS)
    raise ParcelError(f"could not settle the claim on {ckpt_dir} after 1000 rounds; another process keeps rewriting it")


def _liveness_matters(existing: ClaimRecord | None, ours: ClaimIdentity) -> bool:
    """Only a held claim of this very trial by another process needs the (possibly remote) probe."""
    return (
        existing is not None
        and existing.state is ClaimState.HELD
        and not _other_search(existing, ours)
        and not existing.trial.mismatch(ours.trial)
        and existing.fold == ours.fold
        and existing.attempt <= ours.attempt
        and not ours.same_holder(existing)
    )


def read_claim(ckpt_dir: str | os.PathLike) -> ClaimRecord | None:
    """The current (highest) claim generation, or None when the directory was never claimed."""
    ckpt_dir = Path(ckpt_dir)
    try:
        gens = [int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := CLAIM_FILE_RE.fullmatch(n))]
    except FileNotFoundError:
        return None
    if not gens:
        return None
    gen = max(gens)
    # A cached directory listing (NFS) may be behind: probe later generations by name.
    while (ckpt_dir / _claim_name(gen + 1)).exists():
        gen += 1
    return read_generation(ckpt_dir, gen)


def _create_generation(ckpt_dir: Path, record: ClaimRecord) -> bool:
    data = (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()
    return create_exclusive(ckpt_dir / _claim_name(record.generation), data, FILE_MODE)


def read_generation(ckpt_dir: Path, gen: int) -> ClaimRecord:
    path = ckpt_dir / _claim_name(gen)
    record = ClaimRecord.from_json(read_json(path), str(path))
    if record.generation != gen:
        raise CorruptRecord(f"{path} says generation {record.generation}; move the directory aside with quarantine_move")
    return record


def _claim_name(gen: int) -> str:
    return f"claim-{gen:06d}.json"


# ---------------------------------------------------------------------------- directory moves


def quarantine_move(path: str | os.PathLike, quarantine_root: str | os.PathLike, trial_id: str, reason: str, *, clock: Callable[[], float] = time.time) -> Path:
    """Move ``path`` (file or directory) into ``quarantine_root/<trial_id>-<UTC stamp>-<uuid>/`` and return that folder.

    The moved item keeps its name inside the folder, next to ``reason.json``. One ``os.rename``:
    it never copies and never deletes, so it refuses to cross filesystems.
    """
    check_trial_id(trial_id)
    src = Path(path)
    if not src.exists():
        raise UsageError(f"nothing to quarantine at {src}; check the path")
    now = clock()
    dest = Path(quarantine_root) / f"{trial_id}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{uuid.uuid4().hex[:8]}"
    ensure_dir(dest.parent)
    os.mkdir(dest, DIR_MODE)  # unique name: EEXIST would be a uuid collision, and must not be ignored
    atomic_write_json(
        dest / "reason.json",
        {"trial_id": trial_id, "reason": reason, "moved_from": str(src.resolve()), "item": src.name, "time": _iso(now), "host": socket.gethostname()},
    )
    try:
        os.rename(src, dest / src.name)
    except OSError as exc:
        raise UsageError(f"cannot move {src} into {dest} ({exc.strerror}); put the quarantine root on the same filesystem as the checkpoints") from None
    fsync_dir(dest)
    fsync_dir(src.parent)
    return dest


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"
