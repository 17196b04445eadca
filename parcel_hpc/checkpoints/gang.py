"""One checkpoint across the ranks of a gang: a trial run as several processes (issue 50).

Each rank writes its part of a step as an ordinary checkpoint file (``format.py``: the trial's
identity, the step, a digest of every byte), ``ckpt-000041.rank-0003.h5``, naming in its header the
rank, the world size and the attempt that wrote it. Rank 0 commits the step with
``ckpt-000041.manifest.json`` once every part of this attempt is in place: the world size and each
part's body digest and length, read from the parts' own headers, written temp + fsync + rename. A
step counts only when its manifest is there and every part it names still carries that digest, so a
crash at any instant (a rank killed mid-write, rank 0 before the commit) leaves the previous
complete step. Every rank decides which step that is alike, from the same manifests and headers
(2 KiB each), never from a body only one of them read; a rank that finds its own part's body
damaged sets the step's manifest aside (renamed, never deleted) and fails, so the gang's next
attempt agrees on the step before. A part left by an earlier attempt (a timeline abandoned at a
resume) is never committed: the attempt in its header is not this one.

Must not: decide when ranks save or commit (the gang's runtime does), hold the gang's claim (one
claim for the gang, rank 0's; the others verify it), or remove a part of a step newer than the last
committed one (a rank may be writing it).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.checkpoints import KEEP_LAST
from parcel_hpc.checkpoints import format as ckpt_format
from parcel_hpc.checkpoints.claims import Claim
from parcel_hpc.checkpoints.format import Checkpoint, Unusable
from parcel_hpc.checkpoints.store import CheckpointStore, Prepared
from parcel_hpc.errors import ParcelError, UsageError
from parcel_hpc.fsio import FILE_MODE, _unlink_quietly, atomic_write_json, ensure_dir, fsync_dir, read_json
from parcel_hpc.governance.admission import TrialIdentity

MANIFEST_FORMAT = "parcel_hpc.gang-checkpoint"
MANIFEST_VERSION = 1
GANG_KEY = "gang"  # the part's extra: {"rank", "world_size", "attempt"}
DAMAGED = ".damaged"  # a manifest set aside: a part of its step failed its digest
_PART_RE = re.compile(r"ckpt-(\d{6,})\.rank-(\d{4,})\.h5")
_MANIFEST_RE = re.compile(r"ckpt-(\d{6,})\.manifest\.json")


def part_name(step: int, rank: int) -> str:
    return f"ckpt-{step:06d}.rank-{rank:04d}.h5"


def manifest_name(step: int) -> str:
    return f"ckpt-{step:06d}.manifest.json"


@dataclass(frozen=True)
class Part:
    """One rank's file of a committed step, as its header said when rank 0 committed it."""

    rank: int
    digest: str
    length: int


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    attempt: int  # the attempt whose ranks wrote every part
    parts: tuple[Part, ...]  # rank 0 first, one per rank


@dataclass(frozen=True)
class GangRestore:
    """The newest complete step and this rank's part of it (verified)."""

    manifest: Manifest
    own: Checkpoint


class WorldSizeChanged(UsageError):
    """The newest complete step was written by another number of ranks than this attempt has."""


class PartsMissing(Exception):
    """Rank 0 waited for every rank's part of a step and some never arrived: the step is not committed."""


class PartDamaged(Exception):
    """This rank's part of the newest complete step failed its digest: the step was set aside."""


def trainer_extra(part: Checkpoint) -> dict[str, Any]:
    """A part's extras as the rank's trainer saved them: the gang's own header fields left out."""
    return {k: v for k, v in (part.extra or {}).items() if k != GANG_KEY}


@dataclass(frozen=True)
class Committed:
    """The gang's newest complete step as a reader outside the gang sees it (the selection's rescore):
    its manifest, and each rank's part read on demand, one at a time (a large model's parts need not
    all fit in one process). It writes nothing: a damaged part is one line (``UsageError``), never
    set aside, since the trial's directory is not the reader's."""

    ckpt_dir: Path
    identity: TrialIdentity
    manifest: Manifest

    @classmethod
    def newest(cls, ckpt_dir: str | os.PathLike, identity: TrialIdentity, world_size: int) -> Committed | None:
        """The newest complete step of a gang of ``world_size`` ranks; None: no complete step."""
        newest = cls._view(Path(ckpt_dir), identity, world_size).newest_complete()
        if newest is None:
            return None
        if newest.world_size != world_size:
            raise WorldSizeChanged(
                f"the gang's checkpoint at step {newest.step} in {ckpt_dir} was written by {newest.world_size} ranks, not the trial's {world_size}"
            )
        return cls(Path(ckpt_dir), identity, newest)

    def part(self, rank: int) -> Checkpoint:
        """Rank ``rank``'s part of the step, its body verified against the manifest."""
        try:
            return self._view(self.ckpt_dir, self.identity, self.manifest.world_size).read_part(self.manifest, rank)
        except Unusable as exc:
            raise UsageError(
                f"rank {rank}'s part of step {self.manifest.step} in {self.ckpt_dir} is damaged ({exc}); the committed step cannot be read"
            ) from None

    @staticmethod
    def _view(ckpt_dir: Path, identity: TrialIdentity, world_size: int) -> GangCheckpoints:
        return GangCheckpoints(ckpt_dir, identity, rank=0, world_size=world_size, attempt=0)  # the attempt only matters to a writer


class GangCheckpoints:
    """One rank's view of the gang's checkpoints in the trial's one (claimed) directory."""

    def __init__(
        self,
        ckpt_dir: str | os.PathLike,
        identity: TrialIdentity,
        *,
        rank: int,
        world_size: int,
        attempt: int,
        keep_last: int = KEEP_LAST,
        claim: Claim | None = None,
        commit_wait_s: float = 60.0,
    ) -> None:
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise UsageError(f"rank {rank!r} of world size {world_size!r}: a rank is 0 .. world size - 1")
        if not isinstance(keep_last, int) or keep_last < 1:
            raise UsageError(f"keep_last={keep_last!r} must be an int >= 1")
        self.ckpt_dir = Path(ckpt_dir)
        self.identity = identity
        self.rank, self.world_size, self.attempt = rank, world_size, attempt
        self.keep_last = keep_last
        self.claim = claim  # rank 0's, or the gang's claim as a follower verifies it
        self.commit_wait_s = commit_wait_s  # rank 0: how long a commit waits for the other ranks' parts
        self._parts = CheckpointStore(ckpt_dir, identity)  # its checks and copies; it never writes here

    # --- every rank ---------------------------------------------------------------------------
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
        """This rank's part checked (and, with ``copy``, taken out of the caller's memory) as a single
        trial's save is (``CheckpointStore.prepare``), its header naming the rank, world size and attempt."""
        if GANG_KEY in (extra or {}):
            raise UsageError(f"extra[{GANG_KEY!r}] is the gang's own; name yours otherwise")
        gang = {GANG_KEY: {"rank": self.rank, "world_size": self.world_size, "attempt": self.attempt}}
        return self._parts.prepare(step, params, optimizer, rng_state, {**(extra or {}), **gang}, copy=copy)

    def write(self, prepared: Prepared) -> Path:
        """The background writer's call: this rank's part; on rank 0, then the step's commit (waiting up
        to ``commit_wait_s`` for the other ranks' parts)."""
        path = self.write_part(prepared)
        if self.rank == 0:
            self.commit(prepared.step, wait_s=self.commit_wait_s)
        return path

    def write_part(self, prepared: Prepared) -> Path:
        """This rank's part of the step, durable: temp file, fsync, rename, directory fsync."""
        if self.claim is not None:
            self.claim.verify()
        ensure_dir(self.ckpt_dir)
        self._remove_own_temps()
        final = self.ckpt_dir / part_name(prepared.step, self.rank)
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
        return final

    def load_latest(self) -> GangRestore | None:
        """This rank's part of the newest complete step (None: none yet). ``WorldSizeChanged`` when that
        step had another world size; ``PartDamaged`` (the step set aside) when this rank's part fails its digest."""
        newest = self.newest_complete()
        if newest is None:
            return None
        if newest.world_size != self.world_size:
            raise WorldSizeChanged(
                f"the trial's checkpoint at step {newest.step} was written by {newest.world_size} ranks and this attempt has {self.world_size}; "
                "run it with the shape it started with (resources.nodes x resources.tasks_per_node), or from a fresh checkpoint.dir"
            )
        return GangRestore(newest, self.resumed_part(newest, self.rank))

    def resumed_part(self, manifest: Manifest, rank: int) -> Checkpoint:
        """Rank ``rank``'s part of the step this rank resumes from (its own, or one whose state every rank
        restores: a replicated state rank 0 alone saved); ``PartDamaged`` (the step set aside) when it fails its digest."""
        try:
            return self.read_part(manifest, rank)
        except Unusable as exc:
            self.set_aside(manifest.step)
            raise PartDamaged(
                f"rank {rank}'s part of step {manifest.step} is damaged ({exc}); the step is set aside and the next attempt resumes before it"
            ) from None

    def read_part(self, manifest: Manifest, rank: int) -> Checkpoint:
        """Any rank's part of a committed step, its body verified (a trainer that reshards reads them all)."""
        ckpt = ckpt_format.read(self.ckpt_dir / part_name(manifest.step, rank))
        expected = manifest.parts[rank]
        if ckpt.meta.get("body_digest") != expected.digest or ckpt.step != manifest.step:
            raise Unusable(f"part of rank {rank} is not the one step {manifest.step} committed")
        return ckpt

    def newest_complete(self) -> Manifest | None:
        """The newest step whose manifest is intact and whose every part still carries its digest."""
        for step in sorted(self._manifest_steps(), reverse=True):
            manifest = self._manifest(step)
            if manifest is not None and all(self._header_matches(manifest, part) for part in manifest.parts):
                return manifest
        return None

    def set_aside(self, step: int) -> None:
        """No rank resumes from ``step`` again: its manifest renamed aside (kept for whoever looks)."""
        path = self.ckpt_dir / manifest_name(step)
        try:
            os.replace(path, path.with_name(path.name + DAMAGED))
        except FileNotFoundError:
            return  # another rank set it aside first
        fsync_dir(self.ckpt_dir)

    # --- rank 0 -------------------------------------------------------------------------------
    def commit(self, step: int, *, wait_s: float, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Manifest:
        """Rank 0, after its own part: wait up to ``wait_s`` for every rank's part of ``step`` written by
        this attempt, then commit the step (its manifest durable) and prune; ``PartsMissing`` names the
        ranks that never wrote theirs (the step stays uncommitted: the previous one is the newest)."""
        if self.rank != 0:
            raise UsageError(f"rank {self.rank} committed step {step}; rank 0 commits a gang's checkpoint")
        deadline = clock() + wait_s
        while True:
            parts = {rank: self._part_header(step, rank) for rank in range(self.world_size)}
            missing = [rank for rank, part in parts.items() if part is None]
            if not missing:
                break
            if clock() >= deadline:
                raise PartsMissing(
                    f"step {step}: no part from rank {', '.join(map(str, missing))} of {self.world_size} after {wait_s:g} s; the step is not committed"
                )
            sleep(0.05)
        manifest = Manifest(step, self.world_size, self.attempt, tuple(p for p in parts.values() if p is not None))
        atomic_write_json(self.ckpt_dir / manifest_name(step), _manifest_json(manifest, self.identity))
        self._prune(step)
        return manifest

    # --- what the files say -------------------------------------------------------------------
    def _part_header(self, step: int, rank: int) -> Part | None:
        """The part of ``rank`` at ``step`` if this attempt wrote it and its header is intact."""
        header = _header(self.ckpt_dir / part_name(step, rank))
        if header is None or header.get("step") != step or _identity(header) != self.identity:
            return None
        gang = (header.get("extra") or {}).get(GANG_KEY, {})
        if gang != {"rank": rank, "world_size": self.world_size, "attempt": self.attempt}:
            return None  # another attempt's (a timeline abandoned at a resume) or another shape's
        return Part(rank, str(header["body_digest"]), int(header["body_length"]))

    def _header_matches(self, manifest: Manifest, part: Part) -> bool:
        header = _header(self.ckpt_dir / part_name(manifest.step, part.rank))
        return (
            header is not None and header.get("body_digest") == part.digest and header.get("body_length") == part.length and _identity(header) == self.identity
        )

    def _manifest(self, step: int) -> Manifest | None:
        try:
            obj = read_json(self.ckpt_dir / manifest_name(step))
            if obj.get("format") != MANIFEST_FORMAT or obj.get("version") != MANIFEST_VERSION or obj.get("step") != step:
                return None
            if TrialIdentity.from_claim_json(obj["trial"]) != self.identity:
                return None
            parts = tuple(Part(int(r), str(d), int(n)) for r, d, n in obj["parts"])
            world = int(obj["world_size"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, ParcelError):
            return None  # damaged or half-read: not a commit
        if [p.rank for p in parts] != list(range(world)):
            return None
        return Manifest(step, world, int(obj["attempt"]), parts)

    def _manifest_steps(self) -> list[int]:
        return [int(m.group(1)) for name in _names(self.ckpt_dir) if (m := _MANIFEST_RE.fullmatch(name))]

    def _prune(self, committed: int) -> None:
        """Keep the newest ``keep_last`` committed steps up to ``committed``; remove older manifests,
        their parts and every part older than ``committed`` that no kept manifest names."""
        kept = sorted(s for s in self._manifest_steps() if s <= committed)[-self.keep_last :]
        for name in _names(self.ckpt_dir):
            if (m := _MANIFEST_RE.fullmatch(name)) and int(m.group(1)) < kept[0]:
                _unlink_quietly(self.ckpt_dir / name)
            elif (m := _PART_RE.fullmatch(name)) and int(m.group(1)) < committed and int(m.group(1)) not in kept:
                _unlink_quietly(self.ckpt_dir / name)

    def _remove_own_temps(self) -> None:
        """This rank's temp files of a write killed mid-way; another rank's may be in flight."""
        own = re.compile(rf"\.ckpt-\d{{6,}}\.rank-{self.rank:04d}\.h5\..*\.tmp")
        for name in _names(self.ckpt_dir):
            if own.fullmatch(name):
                _unlink_quietly(self.ckpt_dir / name)


def _manifest_json(manifest: Manifest, identity: TrialIdentity) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "step": manifest.step,
        "world_size": manifest.world_size,
        "attempt": manifest.attempt,
        "trial": identity.claim_json(),
        "parts": [[p.rank, p.digest, p.length] for p in manifest.parts],
    }


def _header(path: Path) -> dict[str, Any] | None:
    try:
        return ckpt_format.header(path)
    except Unusable:
        return None


def _identity(header: Mapping[str, Any]) -> TrialIdentity | None:
    try:
        return TrialIdentity.from_claim_json(header)
    except (KeyError, UsageError):
        return None


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
