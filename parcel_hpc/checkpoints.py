"""Atomic, self-verifying h5py checkpoints in a claimed per-trial directory.

Owns the checkpoint files (``ckpt-000041.h5``): written to a temp file, fsynced, renamed, directory
fsynced; each carries its trial identity and a (tree) sha256 over its canonical contents, and
``CheckpointStore.load_latest`` returns only a verified checkpoint of *this* trial, falling back to
the previous good one past a corrupt or truncated file. Claims themselves live in claims.py.

Must not: decide trial states or write the ledger, delete another trial's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .claims import CheckpointCollision, Claim, ClaimIdentity
from .contract import TrialIdentity
from .errors import UsageError
from .fsio import FILE_MODE, _unlink_quietly, canonical_json, ensure_dir, fsync_dir

CKPT_FORMAT = "parcel_hpc.checkpoint"
CKPT_FORMAT_VERSION = 1
_CKPT_RE = re.compile(r"ckpt-(\d{6,})\.h5")
_TMP_RE = re.compile(r"\.ckpt-\d{6,}\.h5\..*\.tmp")
_ARRAY_KINDS = "biufc"  # numbers and bools: bytes that hash the same on every host
_SECTIONS = ("optimizer", "params")


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
_IDENTITY_KEYS = TrialIdentity.CLAIM_FIELDS
_HASH_CHUNK = 8 << 20


class CheckpointStore:
    """One trial's checkpoints in one claimed directory: ``ckpt-<step>.h5``, the newest ``keep_last`` kept.

    With ``claim`` given, every save first checks that the claim still names this attempt.
    ``problems`` lists the files the last ``load_latest`` skipped, for the caller to log.
    """

    def __init__(self, ckpt_dir: str | os.PathLike, identity: TrialIdentity | ClaimIdentity, *, keep_last: int = 3, claim: Claim | None = None) -> None:
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
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"step={step!r} must be an int >= 0")
        arrays = {"params": _normalize(params, "params"), "optimizer": _normalize(optimizer, "optimizer")}
        meta = _meta(self.identity, step, rng_state, extra)
        if self.claim is not None:
            self.claim.verify()
        ensure_dir(self.ckpt_dir)
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
    return Checkpoint(
        meta["step"], arrays["params"], arrays["optimizer"], meta["rng_state"], meta["extra"], path, {k: v for k, v in header.items() if k != "header_sha256"}
    )


def _encode_header(header: dict[str, Any]) -> bytes:
    body = dict(header, header_sha256="sha256:" + hashlib.sha256(canonical_json(header).encode()).hexdigest())
    raw = _MAGIC + canonical_json(body).encode() + b"\n"
    if len(raw) > _HEADER_SIZE:
        raise UsageError(f"checkpoint header is {len(raw)} bytes (max {_HEADER_SIZE}); shorten the trial id or digests")
    return raw.ljust(_HEADER_SIZE, b"\0")


def _decode_header(block: bytes) -> dict[str, Any]:
    if len(block) < _HEADER_SIZE or not block.startswith(_MAGIC):
        raise _Unusable("no parcel_hpc checkpoint header (not written by CheckpointStore, or truncated)")
    line, sep, padding = block[len(_MAGIC) :].partition(b"\n")
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
        return TrialIdentity.from_claim_json(header)
    except (OSError, KeyError, UsageError, _Unusable):
        return None


def _hash_pool() -> ThreadPoolExecutor:
    # hashlib and pread release the GIL: chunks hash in parallel, and alongside HDF5's write.
    return ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="ckpt-hash")


def _chunk_digests(view: memoryview, pool: ThreadPoolExecutor) -> list[Future]:
    return [pool.submit(lambda i=i: hashlib.sha256(view[i : i + _HASH_CHUNK]).digest()) for i in range(0, len(view), _HASH_CHUNK)]


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
    meta = {
        "format": CKPT_FORMAT,
        "format_version": CKPT_FORMAT_VERSION,
        **trial.claim_json(),
        "step": step,
        "rng_state": dict(rng_state),
        "extra": None if extra is None else dict(extra),
    }
    try:
        text = canonical_json(meta)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"rng_state/extra must be JSON values (no NaN, no arrays): {exc}") from None
    return json.loads(text)  # exactly what a reader will see: tuples become lists, keys strings


def _array_digests(arrays: Mapping[str, Mapping[str, np.ndarray]], pool: ThreadPoolExecutor) -> dict:
    """Start hashing every array's bytes; ``_combine_checksum`` collects the results."""
    return {
        (section, name): _chunk_digests(memoryview(arr.reshape(-1)).cast("B") if arr.size else memoryview(b""), pool)
        for section in _SECTIONS
        for name, arr in arrays[section].items()
    }


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
