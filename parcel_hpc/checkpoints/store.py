"""Atomic, self-verifying checkpoints in a claimed per-trial directory.

Owns the checkpoint files (``ckpt-000041.h5``) of one trial: each written to a temp file (its bytes
are ``format.py``'s: identity, an index of its arrays and a digest of every byte), fsynced, renamed,
the directory fsynced; older ones pruned; ``CheckpointStore.load_latest`` returns only a verified
checkpoint of *this* trial, falling back to the previous good one past a corrupt or truncated file.
Claims themselves live in claims.py.

Must not: decide trial states or write the ledger, delete another trial's files.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.checkpoints import KEEP_LAST
from parcel_hpc.checkpoints import format as ckpt_format
from parcel_hpc.checkpoints.claims import CheckpointCollision, Claim, ClaimIdentity
from parcel_hpc.checkpoints.format import Checkpoint
from parcel_hpc.errors import UsageError
from parcel_hpc.fsio import FILE_MODE, _unlink_quietly, ensure_dir, fsync_dir
from parcel_hpc.governance.admission import TrialIdentity

_CKPT_RE = re.compile(r"ckpt-(\d{6,})\.h5")
_TMP_RE = re.compile(r"\.ckpt-\d{6,}\.h5\..*\.tmp")


@dataclass(frozen=True)
class Prepared:
    """A checkpoint checked and ready to write: its step and the file's contents."""

    step: int
    contents: ckpt_format.Contents


@dataclass(frozen=True)
class CheckpointProblem:
    path: Path
    reason: str  # why the file was skipped: truncated, body digest mismatch, damaged header


class CheckpointStore:
    """One trial's checkpoints in one claimed directory: ``ckpt-<step>.h5``, the newest ``keep_last`` kept.

    With ``claim`` given, every save first checks that the claim still names this attempt.
    ``problems`` lists the files the last ``load_latest`` skipped, for the caller to log.
    """

    def __init__(self, ckpt_dir: str | os.PathLike, identity: TrialIdentity | ClaimIdentity, *, keep_last: int = KEEP_LAST, claim: Claim | None = None) -> None:
        if not isinstance(keep_last, int) or keep_last < 1:
            raise UsageError(f"keep_last={keep_last!r} must be an int >= 1")
        self.ckpt_dir = Path(ckpt_dir)
        self.identity = identity.trial if isinstance(identity, ClaimIdentity) else identity
        self.keep_last = keep_last
        self.claim = claim
        self.problems: tuple[CheckpointProblem, ...] = ()

    def save(
        self,
        step: int,
        params: Mapping[str, np.ndarray],
        optimizer: Mapping[str, np.ndarray],
        rng_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write ``ckpt-<step>.h5`` durably; older files are removed only after it is on disk."""
        return self.write(self.prepare(step, params, optimizer, rng_state, extra))

    def prepare(
        self,
        step: int,
        params: Mapping[str, np.ndarray],
        optimizer: Mapping[str, np.ndarray],
        rng_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        *,
        copy: bool = False,
    ) -> Prepared:
        """Check what ``write`` will write (a ``UsageError`` names the first bad value); with ``copy``,
        every array the caller could still change is copied, so it may go on changing its own while a
        writer thread writes these. A read-only array that owns its memory (``trainer.torch.pack``'s)
        is taken as it is: nothing changes it in place, and copying it again would double the wait."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"step={step!r} must be an int >= 0")
        contents = ckpt_format.contents(self.identity, step, params, optimizer, rng_state, extra)
        if copy:
            contents = replace(contents, arrays={s: {n: _owned(a) for n, a in arrays.items()} for s, arrays in contents.arrays.items()})
        return Prepared(step, contents)

    def write(self, prepared: Prepared) -> Path:
        """Write a prepared checkpoint: temp file, fsync, rename, directory fsync, then prune."""
        if self.claim is not None:
            self.claim.verify()
        ensure_dir(self.ckpt_dir)
        _remove_stale_temps(self.ckpt_dir)
        final = self.ckpt_dir / _ckpt_name(prepared.step)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=self.ckpt_dir)
        try:
            os.close(fd)
            ckpt_format.write(tmp, prepared.contents)
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, final)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        fsync_dir(self.ckpt_dir)
        self._prune(prepared.step)
        return final

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; skipped files go to ``problems``. None if there is none.

        Raises CheckpointCollision when any checkpoint here names another trial in an intact header.
        """
        problems: list[CheckpointProblem] = []
        files = step_files(self.ckpt_dir)
        for _, path in files:  # headers only (2 KiB each): a foreign file anywhere is a collision
            if (theirs := ckpt_format.header_identity(path)) and theirs.mismatch(self.identity):
                raise CheckpointCollision(self.ckpt_dir, self.identity, theirs, _foreign_ckpt_reason(path, theirs, self.identity))
        found = None
        for step, path in reversed(files):
            try:
                ckpt = ckpt_format.read(path)
                if ckpt.step != step:
                    raise ckpt_format.Unusable(f"file name says step {step}, contents say {ckpt.step}")
            except ckpt_format.Unusable as exc:
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
        if newer:  # durable, or a crash could bring the abandoned timeline back as the newest
            fsync_dir(self.ckpt_dir)
        # A removal needs no fsync: a crash can only leave an old file, which the next prune removes.


def step_files(ckpt_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint file in the directory, oldest step first."""
    ckpt_dir = Path(ckpt_dir)
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return []
    return sorted((int(m.group(1)), ckpt_dir / n) for n in names if (m := _CKPT_RE.fullmatch(n)))


def _owned(arr: np.ndarray) -> np.ndarray:
    """``arr`` where nothing can change it in place any more, else a copy of it."""
    return arr if _frozen(arr) else arr.copy(order="C")


def _frozen(arr: np.ndarray) -> bool:
    """Read-only, and so is every array it views, down to the one that owns the memory."""
    while not arr.flags.writeable:
        if arr.base is None:
            return bool(arr.flags.owndata)
        if not isinstance(arr.base, np.ndarray):
            return False  # memory some other object lends (a buffer, a tensor) may change under it
        arr = arr.base
    return False


def _foreign_ckpt_reason(path: Path, theirs: TrialIdentity, ours: TrialIdentity) -> str:
    field = theirs.mismatch(ours)
    assert field is not None  # called only for a header that does not match
    return f"{path.name} belongs to trial {theirs.trial_id} ({field} {getattr(theirs, field)}), we are trial {ours.trial_id} ({field} {getattr(ours, field)})"


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
