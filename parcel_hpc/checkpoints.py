"""Exclusive per-trial checkpoint directories and atomic, self-verifying h5py checkpoints.

Owns:
- the claim on a checkpoint directory: a chain of create-exclusive generation files
  (``claim-000000.json``, ``claim-000001.json``, ...). The highest generation is the current
  holder; taking over or re-entering means creating the next generation, which exactly one
  process can do (``fsio.create_exclusive``: link-based, atomic on NFS). No flock, no SQLite.
  ``decide_claim`` is the pure decision; ``claim_directory`` is the side-effecting edge;
- the checkpoint files (``ckpt-000041.h5``): written to a temp file, fsynced, renamed, directory
  fsynced; each carries its trial identity and a (tree) sha256 over its canonical contents, and
  ``CheckpointStore.load_latest`` returns only a verified checkpoint of *this* trial;
- the collision helpers the lifecycle calls: ``scan_for_foreign``, ``quarantine_move``
  (moves, never deletes), ``fresh_directory``.

Must not: decide trial states or write the ledger (the worker and ledger own that), delete another
trial's files, or read the clock, host or pid deep inside a decision (they are passed in).

Decision table (``decide_claim``; "same holder" = same attempt, job_id, host and pid):

    no claim                                              -> CLAIMED
    other trial_id / config_hash / contract or snapshot   -> conflict (FOREIGN_*), never taken over
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

import hashlib
import json
import os
import re
import socket
import tempfile
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping

import h5py
import numpy as np

from .errors import CorruptRecord, ParcelError, UsageError
from .fsio import DIR_MODE, FILE_MODE, atomic_write_json, canonical_json, create_exclusive, fsync_dir, read_json

CLAIM_FORMAT = "parcel_hpc.claim/1"
CKPT_FORMAT = "parcel_hpc.checkpoint"
CKPT_FORMAT_VERSION = 1
_CLAIM_RE = re.compile(r"claim-(\d{6,})\.json")
_CKPT_RE = re.compile(r"ckpt-(\d{6,})\.h5")
_TMP_RE = re.compile(r"\.ckpt-\d{6,}\.h5\..*\.tmp")
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ARRAY_KINDS = "biufc"  # numbers and bools: bytes that hash the same on every host
_SECTIONS = ("optimizer", "params")


class CheckpointCollision(ParcelError):
    """Another trial's claim or checkpoint is in our directory (a bad override), or we are stale.

    Exit 2: the cause is the configuration (two trials pointed at one prefix), not a bug.
    """

    exit_code = 2

    def __init__(self, ckpt_dir: str | os.PathLike, ours: Any, theirs: Any, reason: str) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.ours = ours
        self.theirs = theirs
        self.reason = reason
        super().__init__(
            f"checkpoint collision in {ckpt_dir}: {reason}; HINT: give every trial its own checkpoint "
            "directory (check overrides of the checkpoint prefix), then quarantine the outputs and rerun "
            "the trial in a fresh directory"
        )


# ---------------------------------------------------------------------------- identities and records


@dataclass(frozen=True)
class TrialIdentity:
    trial_id: str  # e.g. "t0007"; safe as a path component
    config_hash: str  # "sha256:..." of the canonical effective config
    contract_digest: str  # "sha256:..." of the frozen search contract
    snapshot_digest: str  # digest of the data snapshot the trial trains on

    def __post_init__(self) -> None:
        _check_safe_id(self.trial_id, "trial_id")
        for name in ("config_hash", "contract_digest"):
            value = getattr(self, name)
            if not (isinstance(value, str) and value.startswith("sha256:") and len(value) > 7):
                raise UsageError(f"{name}={value!r} is not a digest; pass 'sha256:<hex>' from parcel_hpc.contract")
        if not (isinstance(self.snapshot_digest, str) and self.snapshot_digest):
            raise UsageError("snapshot_digest is empty; pass the digest of the data snapshot")

    def mismatch(self, other: TrialIdentity) -> str | None:
        """The first identity field that differs, or None when both name the same trial."""
        for name in ("trial_id", "config_hash", "contract_digest", "snapshot_digest"):
            if getattr(self, name) != getattr(other, name):
                return name
        return None

    def to_json(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in ("trial_id", "config_hash", "contract_digest", "snapshot_digest")}


@dataclass(frozen=True)
class ClaimIdentity:
    trial: TrialIdentity
    job_id: str  # SLURM job id (array form "123_4" allowed); "" when run locally
    attempt: int  # 1-based; increases on requeue or resubmission
    host: str  # socket.gethostname() of the claiming process
    pid: int  # os.getpid() of the claiming process

    def __post_init__(self) -> None:
        if not isinstance(self.trial, TrialIdentity):
            raise UsageError("ClaimIdentity.trial must be a TrialIdentity")
        if not isinstance(self.attempt, int) or isinstance(self.attempt, bool) or self.attempt < 1:
            raise UsageError(f"attempt={self.attempt!r} must be an int >= 1 (SLURM_RESTART_COUNT + 1 or the resubmission count)")
        if not isinstance(self.pid, int) or self.pid < 1:
            raise UsageError(f"pid={self.pid!r} must be a positive int")
        if not isinstance(self.job_id, str) or not isinstance(self.host, str) or not self.host:
            raise UsageError("job_id must be a string and host a non-empty string")

    @classmethod
    def here(cls, trial: TrialIdentity, *, job_id: str = "", attempt: int = 1) -> ClaimIdentity:
        """This process on this host (the one place that reads them)."""
        return cls(trial, job_id, attempt, socket.gethostname(), os.getpid())

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

    def __post_init__(self) -> None:
        ClaimIdentity(self.trial, self.job_id, self.attempt, self.host, self.pid)  # same validation
        if not isinstance(self.state, ClaimState) or not isinstance(self.generation, int) or self.generation < 0:
            raise UsageError("ClaimRecord needs a ClaimState and a generation >= 0")

    @property
    def holder(self) -> ClaimIdentity:
        return ClaimIdentity(self.trial, self.job_id, self.attempt, self.host, self.pid)

    def to_json(self) -> dict[str, Any]:
        return {**self.trial.to_json(), "format": CLAIM_FORMAT, "job_id": self.job_id, "attempt": self.attempt,
                "host": self.host, "pid": self.pid, "time": self.time, "state": self.state.value,
                "generation": self.generation}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ClaimRecord:
        try:
            if obj["format"] != CLAIM_FORMAT:
                raise ValueError(f"format {obj['format']!r}")
            trial = TrialIdentity(obj["trial_id"], obj["config_hash"], obj["contract_digest"], obj["snapshot_digest"])
            return cls(trial, obj["job_id"], obj["attempt"], obj["host"], obj["pid"], obj["time"],
                       ClaimState(obj["state"]), obj["generation"])
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            raise CorruptRecord(f"{where} is not a valid claim ({exc}); move the directory aside with quarantine_move") from None


class ClaimOutcome(Enum):
    CLAIMED = "claimed"
    REENTERED = "reentered"
    TAKEN_OVER = "taken_over"
    FOREIGN_TRIAL = "conflict:trial_id"
    FOREIGN_CONFIG = "conflict:config_hash"
    FOREIGN_SEARCH = "conflict:contract"  # same trial_id and config, another contract or snapshot
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
    field = existing.trial.mismatch(ours.trial)
    if field == "trial_id":
        return ClaimOutcome.FOREIGN_TRIAL
    if field == "config_hash":
        return ClaimOutcome.FOREIGN_CONFIG
    if field is not None:
        return ClaimOutcome.FOREIGN_SEARCH
    if existing.attempt > ours.attempt:
        return ClaimOutcome.STALE_ATTEMPT
    if ours.same_holder(existing) or existing.state is ClaimState.RELEASED:
        return ClaimOutcome.REENTERED
    if holder_alive is True:
        return ClaimOutcome.LIVE_HOLDER
    if existing.attempt < ours.attempt or holder_alive is False:
        return ClaimOutcome.TAKEN_OVER
    return ClaimOutcome.LIVE_HOLDER


def describe_conflict(outcome: ClaimOutcome, existing: ClaimRecord, ours: ClaimIdentity) -> str:
    """Pure: the one-line reason for a conflicting outcome."""
    them, us = existing.trial, ours.trial
    holder = f"attempt {existing.attempt} (job {existing.job_id or '-'}, {existing.host} pid {existing.pid})"
    if outcome is ClaimOutcome.FOREIGN_TRIAL:
        return f"claimed by trial {them.trial_id}, we are trial {us.trial_id}"
    if outcome is ClaimOutcome.FOREIGN_CONFIG:
        return f"trial {us.trial_id} claimed with config {them.config_hash}, ours is {us.config_hash}"
    if outcome is ClaimOutcome.FOREIGN_SEARCH:
        field = them.mismatch(us)
        return f"trial {us.trial_id} claimed under {field} {getattr(them, field)}, ours is {getattr(us, field)}"
    if outcome is ClaimOutcome.STALE_ATTEMPT:
        return f"a newer {holder} owns trial {us.trial_id}; this attempt {ours.attempt} is a stale duplicate and must stop"
    if outcome is ClaimOutcome.LIVE_HOLDER:
        return f"trial {us.trial_id} is held by {holder}, which is alive or cannot be checked from here"
    raise ValueError(f"{outcome} is not a conflict")


# ---------------------------------------------------------------------------- claims (side effects)


def holder_alive_locally(record: ClaimRecord) -> bool | None:
    """Default liveness probe: signal 0 to the pid on this host; None for another host.

    A recycled pid reads as alive (a conservative conflict); a cluster caller can pass a probe that
    asks the scheduler about ``record.job_id`` instead.
    """
    if record.host != socket.gethostname():
        return None
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Claim:
    ckpt_dir: Path
    outcome: ClaimOutcome  # never a conflict: conflicts raise
    record: ClaimRecord  # the current generation, naming us
    previous: ClaimRecord | None  # what was there before (None when CLAIMED)

    def verify(self) -> None:
        """Raise CheckpointCollision unless the claim still names this attempt (the fence)."""
        current = read_claim(self.ckpt_dir)
        if current is None or not self.record.holder.same_holder(current) or current.trial != self.record.trial \
                or current.state is not ClaimState.HELD:
            theirs = current.holder if current else None
            what = f"attempt {current.attempt} (job {current.job_id or '-'}, {current.host} pid {current.pid}, "\
                   f"{current.state.value})" if current else "nobody (claim files removed)"
            raise CheckpointCollision(self.ckpt_dir, self.record.holder, theirs,
                                      f"the claim moved from this attempt to {what}; this process must stop")

    def release(self, *, clock: Callable[[], float] = time.time) -> bool:
        """Mark an orderly exit so the next attempt re-enters; False if someone already took over."""
        current = read_claim(self.ckpt_dir)
        if current is None or not self.record.holder.same_holder(current) or current.state is ClaimState.RELEASED:
            return False
        nxt = ClaimRecord(current.trial, current.job_id, current.attempt, current.host, current.pid,
                          _iso(clock()), ClaimState.RELEASED, current.generation + 1)
        return _create_generation(self.ckpt_dir, nxt)


def claim_directory(ckpt_dir: str | os.PathLike, identity: ClaimIdentity, *,
                    is_alive: Callable[[ClaimRecord], bool | None] = holder_alive_locally,
                    clock: Callable[[], float] = time.time) -> Claim:
    """Claim ``ckpt_dir`` for ``identity`` before anything is written there; raise on a conflict.

    Each transition creates the next claim generation exclusively; a process that loses that race
    reads the winner's record and decides again, so exactly one process holds the directory.
    """
    ckpt_dir = make_dirs(ckpt_dir)
    current = read_claim(ckpt_dir)
    for _ in range(1000):  # each lap means another process won a generation; bounded for safety
        alive = is_alive(current) if _liveness_matters(current, identity) else None
        outcome = decide_claim(current, identity, holder_alive=alive)
        if outcome.is_conflict():
            raise CheckpointCollision(ckpt_dir, identity, current.holder, describe_conflict(outcome, current, identity))
        if current is not None and identity.same_holder(current) and current.state is ClaimState.HELD:
            return Claim(ckpt_dir, outcome, current, current)  # idempotent: already ours
        gen = 0 if current is None else current.generation + 1
        mine = ClaimRecord(identity.trial, identity.job_id, identity.attempt, identity.host, identity.pid,
                           _iso(clock()), ClaimState.HELD, gen)
        if _create_generation(ckpt_dir, mine):
            return Claim(ckpt_dir, outcome, mine, current)
        current = _read_generation(ckpt_dir, gen)  # the winner's record, read by name (fresh on NFS)
    raise ParcelError(f"could not settle the claim on {ckpt_dir} after 1000 rounds; another process keeps rewriting it")


def _liveness_matters(existing: ClaimRecord | None, ours: ClaimIdentity) -> bool:
    """Only a held claim of this very trial by another process needs the (possibly remote) probe."""
    return (existing is not None and existing.state is ClaimState.HELD and not existing.trial.mismatch(ours.trial)
            and existing.attempt <= ours.attempt and not ours.same_holder(existing))


def read_claim(ckpt_dir: str | os.PathLike) -> ClaimRecord | None:
    """The current (highest) claim generation, or None when the directory was never claimed."""
    ckpt_dir = Path(ckpt_dir)
    try:
        gens = [int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := _CLAIM_RE.fullmatch(n))]
    except FileNotFoundError:
        return None
    if not gens:
        return None
    gen = max(gens)
    # A cached directory listing (NFS) may be behind: probe later generations by name.
    while (ckpt_dir / _claim_name(gen + 1)).exists():
        gen += 1
    return _read_generation(ckpt_dir, gen)


def _create_generation(ckpt_dir: Path, record: ClaimRecord) -> bool:
    data = (json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n").encode()
    return create_exclusive(ckpt_dir / _claim_name(record.generation), data, FILE_MODE)


def _read_generation(ckpt_dir: Path, gen: int) -> ClaimRecord:
    path = ckpt_dir / _claim_name(gen)
    record = ClaimRecord.from_json(read_json(path), str(path))
    if record.generation != gen:
        raise CorruptRecord(f"{path} says generation {record.generation}; move the directory aside with quarantine_move")
    return record


def _claim_name(gen: int) -> str:
    return f"claim-{gen:06d}.json"


# ---------------------------------------------------------------------------- checkpoints
#
# File layout: an ordinary HDF5 file (h5py/h5dump open it) with a 2 KiB HDF5 user block in front.
# The user block holds a one-line JSON header: the identity, the step, the content checksum, and the
# digest and length of every byte after the block; the header hashes itself. Reading checks the
# header and the body hash BEFORE HDF5 parses anything: the HDF5 library can crash (SIGSEGV) on a
# damaged file, so it only ever sees bytes that are exactly what was written. Within the file, the
# root attributes repeat the metadata and ``checksum`` covers every dataset's section, name, dtype,
# shape and bytes plus the metadata (format-independent: it survives an h5repack).
# Both digests are sha256 trees ("sha256t:"): sha256 over the sha256 of each 8 MiB chunk, so they
# hash on all cores and, on save, while HDF5 writes; a flipped bit anywhere changes the root.


@dataclass(frozen=True)
class Checkpoint:
    step: int
    params: dict[str, np.ndarray]  # C-contiguous, little-endian
    optimizer: dict[str, np.ndarray]
    rng_state: dict[str, Any]  # JSON value, e.g. numpy ``bit_generator.state``
    extra: dict[str, Any] | None
    path: Path
    meta: dict[str, Any]  # identity, step, format, checksum, body digest, as stored in the header


@dataclass(frozen=True)
class CheckpointProblem:
    path: Path
    reason: str  # why the file was skipped: truncated, body hash or checksum mismatch, damaged header


class _Unusable(Exception):
    """A checkpoint file that cannot be trusted; becomes a CheckpointProblem."""


_HEADER_SIZE = 2048  # HDF5 user block: a power of two >= 512
_MAGIC = b"PARCEL_HPC_CHECKPOINT\n"
_IDENTITY_KEYS = ("trial_id", "config_hash", "contract_digest", "snapshot_digest")
_HASH_CHUNK = 8 << 20


class CheckpointStore:
    """One trial's checkpoints in one claimed directory: ``ckpt-<step>.h5``, the newest ``keep_last`` kept.

    With ``claim`` given, every save first checks that the claim still names this attempt.
    ``problems`` lists the files the last ``load_latest`` skipped, for the caller to log.
    """

    def __init__(self, ckpt_dir: str | os.PathLike, identity: TrialIdentity | ClaimIdentity, *,
                 keep_last: int = 3, claim: Claim | None = None) -> None:
        if not isinstance(keep_last, int) or keep_last < 1:
            raise UsageError(f"keep_last={keep_last!r} must be an int >= 1")
        self.ckpt_dir = Path(ckpt_dir)
        self.identity = identity.trial if isinstance(identity, ClaimIdentity) else identity
        self.keep_last = keep_last
        self.claim = claim
        self.problems: tuple[CheckpointProblem, ...] = ()

    def save(self, step: int, params: Mapping[str, np.ndarray], optimizer: Mapping[str, np.ndarray],
             rng_state: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> Path:
        """Write ``ckpt-<step>.h5`` durably; older files are removed only after it is on disk."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"step={step!r} must be an int >= 0")
        arrays = {"params": _normalize(params, "params"), "optimizer": _normalize(optimizer, "optimizer")}
        meta = _meta(self.identity, step, rng_state, extra)
        if self.claim is not None:
            self.claim.verify()
        make_dirs(self.ckpt_dir)
        _remove_stale_temps(self.ckpt_dir)
        final = self.ckpt_dir / _ckpt_name(step)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=self.ckpt_dir)
        try:
            os.close(fd)
            with _hash_pool() as pool:
                digests = _array_digests(arrays, pool)  # hashed while HDF5 writes: both release the GIL
                # locking=False: HDF5's own flock is unreliable on NFS, and the claim already excludes writers.
                with h5py.File(tmp, "w", locking=False, userblock_size=_HEADER_SIZE) as f:
                    for key, value in meta.items():
                        f.attrs[key] = canonical_json(value) if key in ("rng_state", "extra") else value
                    for section in _SECTIONS:
                        group = f.create_group(section)
                        for name, arr in arrays[section].items():
                            group.create_dataset(name, data=arr)
                    checksum = _combine_checksum(meta, arrays, digests)
                    f.attrs["checksum"] = checksum
                with open(tmp, "r+b") as fh:
                    body_sha256, body_length = _hash_body(fh, pool)
                    header = {key: meta[key] for key in ("format", "format_version", *_IDENTITY_KEYS, "step")}
                    header.update(checksum=checksum, body_sha256=body_sha256, body_length=body_length)
                    fh.seek(0)
                    fh.write(_encode_header(header))
                    fh.flush()
                    os.fsync(fh.fileno())
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, final)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        fsync_dir(self.ckpt_dir)
        self._prune(step)
        return final

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; skipped files go to ``problems``. None if there is none.

        Raises CheckpointCollision when any checkpoint here names another trial in an intact header.
        """
        problems: list[CheckpointProblem] = []
        files = step_files(self.ckpt_dir)
        for _, path in files:  # headers only (2 KiB each): a foreign file anywhere is a collision
            if (theirs := _header_identity(path)) and theirs.mismatch(self.identity):
                raise CheckpointCollision(self.ckpt_dir, self.identity, theirs, _foreign_ckpt_reason(path, theirs, self.identity))
        found = None
        for step, path in reversed(files):
            try:
                ckpt = _read_checkpoint(path)
                if ckpt.step != step:
                    raise _Unusable(f"file name says step {step}, contents say {ckpt.step}")
            except _Unusable as exc:
                problems.append(CheckpointProblem(path, str(exc)))
                continue
            found = ckpt
            break
        self.problems = tuple(problems)
        return found

    def _prune(self, step: int) -> None:
        files = step_files(self.ckpt_dir)
        newer = [p for s, p in files if s > step]
        for path in newer:  # a timeline abandoned by resuming from an older step: set aside, never read
            os.replace(path, path.with_name(path.name + ".abandoned"))
        kept = [p for s, p in files if s <= step]
        for path in kept[: max(0, len(kept) - self.keep_last)]:
            _unlink_quietly(path)
        if newer or len(kept) > self.keep_last:
            fsync_dir(self.ckpt_dir)


def step_files(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint file in the directory, oldest step first."""
    ckpt_dir = Path(ckpt_dir)
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)), ckpt_dir / n) for n in names if (m := _CKPT_RE.fullmatch(n)))


def _read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read one file, verifying header, body hash and content checksum; raises _Unusable otherwise.

    The identity is returned, not judged: comparing it with the reader's trial is the caller's job.
    """
    path = Path(path)
    with _hash_pool() as pool:
        return _read_verified(path, pool)


def _read_verified(path: Path, pool: ThreadPoolExecutor) -> Checkpoint:
    try:
        with open(path, "rb") as fh:
            header = _decode_header(fh.read(_HEADER_SIZE))
            body_sha256, body_length = _hash_body(fh, pool)
    except OSError as exc:
        raise _Unusable(f"cannot read ({exc.strerror})") from None
    if body_length != header["body_length"]:
        raise _Unusable(f"truncated or extended: {body_length} bytes after the header, {header['body_length']} written")
    if body_sha256 != header["body_sha256"]:
        raise _Unusable("body sha256 mismatch: the file was damaged after it was written")
    try:
        with h5py.File(path, "r", locking=False) as f:
            attrs = {k: _plain(v) for k, v in f.attrs.items()}
            arrays = {s: _normalize(_read_group(f[s]), s) for s in _SECTIONS}
        meta = {k: attrs[k] for k in ("format", "format_version", *_IDENTITY_KEYS, "step")}
        meta.update(rng_state=json.loads(attrs["rng_state"]), extra=json.loads(attrs["extra"]))
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, UsageError) as exc:
        raise _Unusable(f"HDF5 contents unreadable ({type(exc).__name__}: {exc})") from None
    if _combine_checksum(meta, arrays, _array_digests(arrays, pool)) != attrs.get("checksum") or attrs.get("checksum") != header["checksum"]:
        raise _Unusable("content checksum mismatch: datasets or metadata differ from what was saved")
    if any(meta[k] != header[k] for k in (*_IDENTITY_KEYS, "step")):
        raise _Unusable("header and HDF5 attributes disagree on identity or step")
    return Checkpoint(meta["step"], arrays["params"], arrays["optimizer"], meta["rng_state"], meta["extra"], path,
                      {k: v for k, v in header.items() if k != "header_sha256"})


def _encode_header(header: dict[str, Any]) -> bytes:
    body = dict(header, header_sha256="sha256:" + hashlib.sha256(canonical_json(header).encode()).hexdigest())
    raw = _MAGIC + canonical_json(body).encode() + b"\n"
    if len(raw) > _HEADER_SIZE:
        raise UsageError(f"checkpoint header is {len(raw)} bytes (max {_HEADER_SIZE}); shorten the trial id or digests")
    return raw.ljust(_HEADER_SIZE, b"\0")


def _decode_header(block: bytes) -> dict[str, Any]:
    if len(block) < _HEADER_SIZE or not block.startswith(_MAGIC):
        raise _Unusable("no parcel_hpc checkpoint header (not written by CheckpointStore, or truncated)")
    line, sep, padding = block[len(_MAGIC):].partition(b"\n")
    if not sep or padding.strip(b"\0"):
        raise _Unusable("checkpoint header damaged (no end of line, or bytes in its padding)")
    try:
        body = json.loads(line)
        claimed = body.pop("header_sha256")
    except (ValueError, KeyError, AttributeError, TypeError):
        raise _Unusable("checkpoint header damaged") from None
    if "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest() != claimed:
        raise _Unusable("checkpoint header damaged (its own sha256 does not match)")
    if body.get("format") != CKPT_FORMAT or body.get("format_version") != CKPT_FORMAT_VERSION:
        raise _Unusable(f"not a {CKPT_FORMAT} v{CKPT_FORMAT_VERSION} file")
    return body


def _header_identity(path: Path) -> TrialIdentity | None:
    """The trial named by an intact header; None when the header is unreadable (that is damage)."""
    try:
        with open(path, "rb") as fh:
            header = _decode_header(fh.read(_HEADER_SIZE))
        return TrialIdentity(*(header[k] for k in _IDENTITY_KEYS))
    except (OSError, KeyError, UsageError, _Unusable):
        return None


def _hash_pool() -> ThreadPoolExecutor:
    # hashlib and pread release the GIL: chunks hash in parallel, and alongside HDF5's write.
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="ckpt-hash")


def _chunk_digests(view: memoryview, pool: ThreadPoolExecutor) -> list[Future]:
    return [pool.submit(lambda i=i: hashlib.sha256(view[i:i + _HASH_CHUNK]).digest())
            for i in range(0, len(view), _HASH_CHUNK)]


def _tree_digest(chunk_digests: list[Future]) -> bytes:
    """sha256 over the sha256 of each _HASH_CHUNK-byte chunk: sequential-equivalent, parallel to compute."""
    return hashlib.sha256(b"".join(f.result() for f in chunk_digests)).digest()


def _hash_body(fh: Any, pool: ThreadPoolExecutor) -> tuple[str, int]:
    """Tree sha256 and length of every byte after the header block."""
    fd = fh.fileno()
    length = max(0, os.fstat(fd).st_size - _HEADER_SIZE)

    def chunk(offset: int) -> bytes:
        want = min(_HASH_CHUNK, _HEADER_SIZE + length - offset)
        data = os.pread(fd, want, offset)
        if len(data) != want:
            raise OSError(0, "file shrank while it was being read")
        return hashlib.sha256(data).digest()

    futures = [pool.submit(chunk, off) for off in range(_HEADER_SIZE, _HEADER_SIZE + length, _HASH_CHUNK)]
    return "sha256t:" + _tree_digest(futures).hex(), length


def _meta(trial: TrialIdentity, step: int, rng_state: Mapping[str, Any], extra: Mapping[str, Any] | None) -> dict:
    meta = {"format": CKPT_FORMAT, "format_version": CKPT_FORMAT_VERSION, **trial.to_json(), "step": step,
            "rng_state": dict(rng_state), "extra": None if extra is None else dict(extra)}
    try:
        text = canonical_json(meta)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"rng_state/extra must be JSON values (no NaN, no arrays): {exc}") from None
    return json.loads(text)  # exactly what a reader will see: tuples become lists, keys strings


def _array_digests(arrays: Mapping[str, Mapping[str, np.ndarray]], pool: ThreadPoolExecutor) -> dict:
    """Start hashing every array's bytes; ``_combine_checksum`` collects the results."""
    return {(section, name): _chunk_digests(memoryview(arr.reshape(-1)).cast("B") if arr.size else memoryview(b""), pool)
            for section in _SECTIONS for name, arr in arrays[section].items()}


def _combine_checksum(meta: Mapping[str, Any], arrays: Mapping[str, Mapping[str, np.ndarray]], digests: dict) -> str:
    """sha256 over the metadata and, per dataset in (section, name) order, its section, name, dtype,
    shape and the tree sha256 of its bytes; every part length-prefixed so no two layouts collide."""
    h = hashlib.sha256()

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    part(canonical_json(meta).encode())
    for section in _SECTIONS:
        for name in sorted(arrays[section]):
            arr = arrays[section][name]
            part(canonical_json([section, name, arr.dtype.str, list(arr.shape), arr.nbytes]).encode())
            part(_tree_digest(digests[(section, name)]))
    return "sha256t:" + h.hexdigest()


def _normalize(arrays: Mapping[str, Any], section: str) -> dict[str, np.ndarray]:
    """C-contiguous little-endian numeric arrays: the form that is written, read back and hashed."""
    out: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or any(p in ("", ".", "..") for p in name.split("/")):
            raise UsageError(f"{section} name {name!r} is not a valid dataset path; use 'layer/weight'-style names")
        arr = np.asarray(value)
        if arr.dtype.kind not in _ARRAY_KINDS:
            raise UsageError(f"{section}[{name!r}] has dtype {arr.dtype}; checkpoints hold numeric or bool arrays only")
        little = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
        out[name] = np.asarray(arr, dtype=little, order="C")  # not ascontiguousarray: it turns 0-d into 1-d
    for name in out:
        parts = name.split("/")
        if any("/".join(parts[:i]) in out for i in range(1, len(parts))):
            raise UsageError(f"{section} name {name!r} nests under another array's name; rename one of them")
    return out


def _read_group(group: h5py.Group) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    group.visititems(lambda name, obj: out.__setitem__(name, np.asarray(obj[()])) if isinstance(obj, h5py.Dataset) else None)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _foreign_ckpt_reason(path: Path, theirs: TrialIdentity, ours: TrialIdentity) -> str:
    field = theirs.mismatch(ours)
    return f"{path.name} belongs to trial {theirs.trial_id} ({field} {getattr(theirs, field)}), we are trial " \
           f"{ours.trial_id} ({field} {getattr(ours, field)})"


def _ckpt_name(step: int) -> str:
    return f"ckpt-{step:06d}.h5"


def _remove_stale_temps(ckpt_dir: Path) -> None:
    """Temp files of a writer killed mid-save. Called by the saver only: the claim makes it the one writer."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return
    for name in names:
        if _TMP_RE.fullmatch(name):
            _unlink_quietly(ckpt_dir / name)


# ---------------------------------------------------------------------------- collision helpers


def scan_for_foreign(ckpt_dir: str | os.PathLike, identity: TrialIdentity | ClaimIdentity) -> list[str]:
    """Reasons why ``ckpt_dir`` holds another trial's claim or checkpoint; [] when it is clean.

    Every claim generation is checked, not only the current one: a directory that ever belonged to
    another trial is not this trial's.
    """
    ours = identity.trial if isinstance(identity, ClaimIdentity) else identity
    ckpt_dir = Path(ckpt_dir)
    try:
        names = sorted(os.listdir(ckpt_dir))
    except FileNotFoundError:
        return []
    reasons: list[str] = []
    for name in names:
        if m := _CLAIM_RE.fullmatch(name):
            try:
                record = _read_generation(ckpt_dir, int(m.group(1)))
            except CorruptRecord as exc:
                reasons.append(f"{name} is not a readable claim ({exc})")
                continue
            if field := record.trial.mismatch(ours):
                reasons.append(f"{name} was written by trial {record.trial.trial_id} ({field} "
                               f"{getattr(record.trial, field)}), we are trial {ours.trial_id}")
    for _, path in step_files(ckpt_dir):  # an intact header naming another trial; damage is not foreignness
        if (theirs := _header_identity(path)) and theirs.mismatch(ours):
            reasons.append(_foreign_ckpt_reason(path, theirs, ours))
    return reasons


def quarantine_move(path: str | os.PathLike, quarantine_root: str | os.PathLike, trial_id: str, reason: str, *,
                    clock: Callable[[], float] = time.time) -> Path:
    """Move ``path`` (file or directory) into ``quarantine_root/<trial_id>-<UTC stamp>-<uuid>/`` and return that folder.

    The moved item keeps its name inside the folder, next to ``reason.json``. One ``os.rename``:
    it never copies and never deletes, so it refuses to cross filesystems.
    """
    _check_safe_id(trial_id, "trial_id")
    src = Path(path)
    if not src.exists():
        raise UsageError(f"nothing to quarantine at {src}; check the path")
    now = clock()
    dest = Path(quarantine_root) / f"{trial_id}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}-{uuid.uuid4().hex[:8]}"
    make_dirs(dest.parent)
    os.mkdir(dest, DIR_MODE)  # unique name: EEXIST would be a uuid collision, and must not be ignored
    atomic_write_json(dest / "reason.json", {"trial_id": trial_id, "reason": reason, "moved_from": str(src.resolve()),
                                              "item": src.name, "time": _iso(now), "host": socket.gethostname()})
    try:
        os.rename(src, dest / src.name)
    except OSError as exc:
        raise UsageError(f"cannot move {src} into {dest} ({exc.strerror}); put the quarantine root on the same "
                         "filesystem as the checkpoints") from None
    fsync_dir(dest)
    fsync_dir(src.parent)
    return dest


def fresh_directory(root: str | os.PathLike, trial_id: str, attempt: int) -> Path:
    """A new, empty, never-before-used directory ``root/<trial_id>-a<attempt>-<uuid>`` for a clean rerun."""
    _check_safe_id(trial_id, "trial_id")
    if not isinstance(attempt, int) or attempt < 1:
        raise UsageError(f"attempt={attempt!r} must be an int >= 1")
    root = make_dirs(root)
    while True:
        path = root / f"{trial_id}-a{attempt:03d}-{uuid.uuid4().hex[:12]}"
        try:
            os.mkdir(path, DIR_MODE)  # exclusive: an existing directory is never handed out
        except FileExistsError:
            continue
        fsync_dir(root)
        return path


# ---------------------------------------------------------------------------- small edges


def make_dirs(path: str | os.PathLike) -> Path:
    """mkdir -p where every created level is 0o755 (or tighter by umask), never world-writable.

    ``Path.mkdir(parents=True)`` creates the intermediate levels with 0o777 & ~umask, which is
    world-writable under umask 0; this helper does not.
    """
    path = Path(path)
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass
    if not path.is_dir():
        raise UsageError(f"{path} exists and is not a directory; choose another checkpoint path")
    return path


def _fsync_path(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def _check_safe_id(value: Any, name: str) -> None:
    if not (isinstance(value, str) and _SAFE_ID.fullmatch(value)):
        raise UsageError(f"{name}={value!r} must be letters, digits, '.', '_' or '-' (it names files and folders)")


def _unlink_quietly(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
