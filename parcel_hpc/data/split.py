"""Splits of a snapshot into train / validation / final, and the two files each split is made of.

Owns the split artifacts: ``split-<revision>.json`` (what trials are given: train and validation
ids, the snapshot digest, the digest of the final file) and ``final-<revision>.json`` (the protected
final partition's ids; read only by the one-time final evaluation). Each file carries a ``digest``
of its own canonical content; readers recompute it. A revision is immutable: writing it again with
the same content is a no-op, with different content a refusal.

Two methods: ``group`` keeps every frame of a shipment in one partition (the only honest one, since
frames of a shipment share box, belt and handling); ``random`` assigns frames at random and so
leaks shipments across partitions. It exists so that governance has something real to reject.

The assignment functions are pure; must not: read pixels or hand out the final ids to a trial
(``read_split`` never opens the final file).
"""

from __future__ import annotations

import enum
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.fsio import create_exclusive_json, ensure_dir, read_json
from parcel_hpc.data.digest import DIGEST_FIELD, digest_open_snapshot, json_digest
from parcel_hpc.data.schema import SHIPMENT_ID, inspect_structure, open_snapshot

SPLIT_FORMAT = "parcel-split/1"
FINAL_FORMAT = "parcel-final/1"
ROW = "row"  # the key of a random split: ids are row numbers in the snapshot
_REVISION = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class SplitMethod(enum.Enum):
    GROUP = "group"
    GROUP_KFOLD = "group_kfold"  # the final partition by shipment as GROUP, the rest K folds by shipment
    RANDOM = "random"

    @property
    def key(self) -> str:
        return ROW if self is SplitMethod.RANDOM else SHIPMENT_ID

    def leaks_shipments(self) -> bool:
        return self is SplitMethod.RANDOM


Ids = tuple[str, ...] | tuple[int, ...]  # shipment ids (group) or row numbers (random)


@dataclass(frozen=True)
class Split:
    """A split as a trial sees it: no final ids, only the final file's digest for lineage."""

    method: SplitMethod
    key: str
    revision: str
    snapshot_digest: str
    seed: int
    train: Ids
    validation: Ids
    final_digest: str
    digest: str  # of the split file's content; recomputed by read_split
    path: str
    # K folds of the non-final ids (disjoint, covering train + validation once); () for one split
    folds: tuple[Ids, ...] = ()

    @property
    def fold_count(self) -> int:
        return len(self.folds) or 1

    def fold(self, index: int) -> tuple[Ids, Ids]:
        """(train ids, validation ids) of fold ``index``: the other folds and its own; of a split
        without folds, fold 0 is its train and validation partitions."""
        if not 0 <= index < self.fold_count:
            raise UsageError(f"{self.path} has {self.fold_count} fold(s); fold {index} does not exist")
        if not self.folds:
            return self.train, self.validation
        rest = [i for k, part in enumerate(self.folds) if k != index for i in part]
        return tuple(sorted(rest)), self.folds[index]  # type: ignore[return-value]

    def __post_init__(self) -> None:
        _check_ids(self.method, self.train, "train", self.path)
        _check_ids(self.method, self.validation, "validation", self.path)
        for k, part in enumerate(self.folds):
            _check_ids(self.method, part, f"fold {k}", self.path)
        if self.folds and sorted(i for part in self.folds for i in part) != sorted([*self.train, *self.validation]):
            raise CorruptRecord(f"{self.path}: its folds must cover its train and validation ids once each; regenerate the split under a new revision")
        if self.key != self.method.key:
            raise CorruptRecord(f"{self.path}: a {self.method.value} split must have key {self.method.key!r}, not {self.key!r}")
        if set(self.train) & set(self.validation):
            raise CorruptRecord(f"{self.path}: train and validation share ids; regenerate the split under a new revision")


@dataclass(frozen=True)
class FinalRecord:
    """The protected final partition. Only load_final_partition reads one."""

    method: SplitMethod
    key: str
    revision: str
    snapshot_digest: str
    final: Ids
    digest: str
    path: str

    def __post_init__(self) -> None:
        _check_ids(self.method, self.final, "final", self.path)


@dataclass(frozen=True)
class SplitInfo:
    method: SplitMethod
    revision: str
    split_path: str
    final_path: str
    split_digest: str
    final_digest: str
    snapshot_digest: str
    seed: int
    counts: tuple[int, int, int]  # ids in train, validation, final (shipments, or rows for random)


def assign_groups(ids: Sequence[str], seed: int, fractions: Sequence[float]) -> tuple[tuple[str, ...], ...]:
    """Shuffle the distinct ids with the seed and cut them into (train, validation, final)."""
    distinct = sorted(set(ids))
    parts = _cut(len(distinct), seed, fractions, "shipments")
    return tuple(tuple(sorted(distinct[i] for i in part)) for part in parts)


def assign_rows(n_rows: int, seed: int, fractions: Sequence[float]) -> tuple[tuple[int, ...], ...]:
    """Every row on its own: frames of one shipment land in different partitions."""
    return tuple(tuple(sorted(int(i) for i in part)) for part in _cut(n_rows, seed, fractions, "frames"))


def make_group_split(snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int,
                     fractions: Sequence[float] = (0.7, 0.15, 0.15), revision: str = "group_r8") -> SplitInfo:
    return _make_split(SplitMethod.GROUP, snapshot_path, out_dir, seed, fractions, revision)


def assign_group_folds(ids: Sequence[str], seed: int, k: int, final_fraction: float) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Shuffle the distinct ids with the seed, hold out the final partition, cut the rest into ``k``
    folds of as equal a number of ids as can be: (final, folds)."""
    distinct = sorted(set(ids))
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise UsageError(f"split.folds={k!r} must be an integer of at least 2 (one validation fold, one to train on)")
    n_final = max(1, math.floor(float(final_fraction) * len(distinct) + 0.5))
    if not 0 < final_fraction < 1 or len(distinct) - n_final < k:
        raise UsageError(f"{len(distinct)} shipments cannot give a final partition of {final_fraction} and {k} non-empty folds; use more shipments or fewer folds")
    order = _permutation(len(distinct), seed)
    final = tuple(sorted(distinct[i] for i in order[len(order) - n_final :]))
    rest = order[: len(order) - n_final]
    return final, tuple(tuple(sorted(distinct[i] for i in rest[f::k])) for f in range(k))


def make_group_kfold_split(snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int, folds: int = 5,
                           final_fraction: float = 0.15, revision: str = "group_kfold_r1") -> SplitInfo:
    """The final partition held out by shipment as a group split does; the rest cut into ``folds``
    folds by shipment. The file's train and validation are fold 0's, so a reader that knows no
    folds sees one honest split."""
    split_path, final_path = split_paths(out_dir, revision)
    _check_seed(seed)
    with open_snapshot(snapshot_path) as f:
        snapshot = digest_open_snapshot(f)
        final, parts = assign_group_folds(np.char.decode(f[SHIPMENT_ID][:], "ascii").tolist(), seed, folds, final_fraction)
    validation, train = parts[0], tuple(sorted(i for part in parts[1:] for i in part))
    method = SplitMethod.GROUP_KFOLD
    common = {"method": method.value, "key": method.key, "revision": revision, "snapshot_digest": snapshot, "seed": seed}
    final_content = _sealed({"format": FINAL_FORMAT, **common, "final": list(final)})
    split_content = _sealed({"format": SPLIT_FORMAT, **common, "final_fraction": float(final_fraction), "train": list(train),
                             "validation": list(validation), "folds": [list(part) for part in parts], "final_digest": final_content[DIGEST_FIELD]})
    return _write_split(method, revision, split_path, final_path, split_content, final_content, seed, (len(train), len(validation), len(final)))


def make_random_split(snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int,
                      fractions: Sequence[float] = (0.7, 0.15, 0.15), revision: str = "random_r7") -> SplitInfo:
    return _make_split(SplitMethod.RANDOM, snapshot_path, out_dir, seed, fractions, revision)


def read_split(path: str | os.PathLike) -> Split:
    """The split a trial is given, its digest recomputed from what was read."""
    c = _read_checked(path, SPLIT_FORMAT)
    try:
        return Split(method=_method(c, path), key=c["key"], revision=c["revision"], snapshot_digest=c["snapshot_digest"],
                     seed=c["seed"], train=tuple(c["train"]), validation=tuple(c["validation"]),
                     final_digest=c["final_digest"], digest=c[DIGEST_FIELD], path=str(path),
                     folds=tuple(tuple(part) for part in c.get("folds", ())))
    except (KeyError, TypeError) as exc:
        raise CorruptRecord(f"{path} lacks field {exc}; regenerate the split under a new revision") from None


def read_final_record(path: str | os.PathLike) -> FinalRecord:
    """For load_final_partition only; a trial never has a reason to call this."""
    c = _read_checked(path, FINAL_FORMAT)
    try:
        return FinalRecord(method=_method(c, path), key=c["key"], revision=c["revision"],
                           snapshot_digest=c["snapshot_digest"], final=tuple(c["final"]), digest=c[DIGEST_FIELD], path=str(path))
    except (KeyError, TypeError) as exc:
        raise CorruptRecord(f"{path} lacks field {exc}; regenerate the split under a new revision") from None


def split_paths(out_dir: str | os.PathLike, revision: str) -> tuple[Path, Path]:
    _check_revision(revision)
    return Path(out_dir) / f"split-{revision}.json", Path(out_dir) / f"final-{revision}.json"


def _make_split(method: SplitMethod, snapshot_path, out_dir, seed, fractions, revision) -> SplitInfo:
    split_path, final_path = split_paths(out_dir, revision)
    _check_seed(seed)
    with open_snapshot(snapshot_path) as f:
        n_rows = inspect_structure(f).n_frames
        snapshot = digest_open_snapshot(f)
        train: tuple[str | int, ...]  # shipment ids for a group split, row numbers otherwise
        validation: tuple[str | int, ...]
        final: tuple[str | int, ...]
        if method is SplitMethod.GROUP:
            shipments = np.char.decode(f[SHIPMENT_ID][:], "ascii").tolist()
            train, validation, final = assign_groups(shipments, seed, fractions)
        else:
            train, validation, final = assign_rows(n_rows, seed, fractions)
    common = {"method": method.value, "key": method.key, "revision": revision, "snapshot_digest": snapshot, "seed": seed}
    final_content = _sealed({"format": FINAL_FORMAT, **common, "final": list(final)})
    split_content = _sealed({"format": SPLIT_FORMAT, **common, "fractions": [float(x) for x in fractions],
                             "train": list(train), "validation": list(validation),
                             "final_digest": final_content[DIGEST_FIELD]})
    return _write_split(method, revision, split_path, final_path, split_content, final_content, seed, (len(train), len(validation), len(final)))


def _write_split(method: SplitMethod, revision: str, split_path: Path, final_path: Path, split_content: dict[str, Any],
                 final_content: dict[str, Any], seed: int, counts: tuple[int, int, int]) -> SplitInfo:
    ensure_dir(split_path.parent)
    _write_once(final_path, final_content)
    _write_once(split_path, split_content)
    return SplitInfo(method=method, revision=revision, split_path=str(split_path), final_path=str(final_path),
                     split_digest=split_content[DIGEST_FIELD], final_digest=final_content[DIGEST_FIELD],
                     snapshot_digest=split_content["snapshot_digest"], seed=seed, counts=counts)


def _check_seed(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise UsageError(f"split seed must be a non-negative integer, got {seed!r}")


def _cut(n: int, seed: int, fractions: Sequence[float], unit: str) -> tuple[np.ndarray, ...]:
    fr = _check_fractions(fractions)
    n_val, n_final = (max(1, math.floor(x * n + 0.5)) for x in fr[1:])
    n_train = n - n_val - n_final
    if n_train < 1:
        raise UsageError(f"{n} {unit} cannot be cut into {list(fr)} with every partition non-empty; use more {unit}")
    order = _permutation(n, seed)
    return order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]


def _permutation(n: int, seed: int) -> np.ndarray:
    # argsort of raw uniforms: a permutation that does not depend on numpy's shuffle algorithm
    return np.argsort(np.random.Generator(np.random.PCG64(seed)).random(n), kind="stable")


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(x) for x in fractions)
    if len(fr) != 3 or not all(math.isfinite(x) and x > 0 for x in fr) or abs(sum(fr) - 1.0) > 1e-9:
        raise UsageError(f"fractions {list(fractions)} must be three positive numbers (train, validation, final) summing to 1")
    return fr


def _check_revision(revision: str) -> None:
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise UsageError(f"revision {revision!r} must match {_REVISION.pattern} (it becomes part of a file name)")


def _sealed(content: dict[str, Any]) -> dict[str, Any]:
    return {**content, DIGEST_FIELD: json_digest(content)}


def _write_once(path: Path, content: dict[str, Any]) -> None:
    if create_exclusive_json(path, content):
        return
    if read_json(path) != content:
        raise UsageError(f"{path} already exists with different content; a split revision is immutable: choose a new revision")


# What to give instead of a file that is no split file: the user named it (split.path), and it may
# not be theirs to move or remove (/etc/passwd).
_GIVE = {
    SPLIT_FORMAT: "give split.path the split-<revision>.json that `parcel-hpc make-snapshot` (or make_group_split) writes",
    FINAL_FORMAT: "give the final-<revision>.json written beside the search's split file (`parcel-hpc make-snapshot`)",
}


def _read_checked(path: str | os.PathLike, fmt: str) -> dict[str, Any]:
    try:
        c = read_json(path, named=_GIVE[fmt])  # the user names it, and may name it by a link
    except FileNotFoundError:
        raise UsageError(f"split file {path} does not exist; {_GIVE[fmt]}") from None
    if not isinstance(c, dict) or c.get("format") != fmt:
        found = c.get("format") if isinstance(c, dict) else type(c).__name__
        raise UsageError(f"{path} is {found!r}, not a {fmt!r} file; pass split-<revision>.json to trials, final-<revision>.json only to the final evaluation")
    if c.get(DIGEST_FIELD) != json_digest(c):
        raise CorruptRecord(f"{path} does not match its own digest: it was edited after it was written; regenerate the split under a new revision")
    return c


def _method(c: dict[str, Any], path) -> SplitMethod:
    try:
        return SplitMethod(c.get("method"))
    except ValueError:
        raise CorruptRecord(f"{path} has unknown split method {c.get('method')!r}") from None


def _check_ids(method: SplitMethod, ids: Ids, part: str, path: str) -> None:
    kind = int if method is SplitMethod.RANDOM else str
    if not ids or not all(isinstance(i, kind) and not isinstance(i, bool) for i in ids) or len(set(ids)) != len(ids):
        raise CorruptRecord(f"{path}: {part} must be a non-empty list of distinct {kind.__name__} ids")
