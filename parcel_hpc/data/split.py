"""Splits of a snapshot into train / validation / final, and the two files each split is made of.

Owns the split artifacts: ``split-<revision>.json`` (what trials are given: train and validation
ids, the snapshot digest, the digest of the final file) and ``final-<revision>.json`` (the protected
final partition's ids; read only by the one-time final evaluation). Each file carries a ``digest``
of its own canonical content; readers recompute it. A revision is immutable: writing it again with
the same content is a no-op, with different content a refusal.

Methods: ``group`` keeps every frame of a shipment in one partition (frames of a shipment share box,
belt and handling), and with it every shipment joined to it by a shared parcel or declared group
column (entities.py); ``group_kfold`` holds the final partition out so and cuts the rest into K folds;
``time`` trains on the past, validates on later shipments and holds the latest period out, and
``time_kfold`` chains K folds forward in time (periods.py). ``random`` assigns frames at random and so
leaks shipments across partitions. It exists so that governance has something real to reject.
Every other split is checked when it is made: one whose entities cross partitions is refused
(``split_leak`` names the entity), and a user's own assignment may ask to group the leak away.

The assignment functions are pure; must not: read pixels or hand out the final ids to a trial
(``read_split`` never opens the final file; the leak check counts as final whatever is in no fold).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.data.digest import DIGEST_FIELD, digest_open_snapshot, json_digest
from parcel_hpc.data.entities import Entities, Leak, find_leak, group_leaks_away, read_entities
from parcel_hpc.data.files import split_paths
from parcel_hpc.data.periods import assign_periods, kfold_fractions
from parcel_hpc.data.schema import CAPTURE_TIME, SHIPMENT_ID, open_snapshot
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.fsio import create_exclusive_json, ensure_dir, read_json

SPLIT_FORMAT = "parcel-split/1"
FINAL_FORMAT = "parcel-final/1"
ROW = "row"  # the key of a random split: ids are row numbers in the snapshot


class SplitMethod(enum.Enum):
    GROUP = "group"
    GROUP_KFOLD = "group_kfold"  # the final partition by shipment as GROUP, the rest K folds by shipment
    TIME = "time"  # train on the past, validate on later shipments, the latest period final
    TIME_KFOLD = "time_kfold"  # the latest period final; fold i validates on a period after all it trains on
    RANDOM = "random"

    @property
    def key(self) -> str:
        return ROW if self is SplitMethod.RANDOM else SHIPMENT_ID

    def leaks_shipments(self) -> bool:
        return self is SplitMethod.RANDOM

    @property
    def boundary(self) -> str:
        """What a search on this split validates across, as a release packet states it."""
        return _BOUNDARIES[self]

    def chains_folds(self) -> bool:
        """Fold i trains only on what comes before it (time), not on every other fold."""
        return self is SplitMethod.TIME_KFOLD


_BOUNDARIES = {
    SplitMethod.GROUP: "by shipment: validated on shipments it did not train on; the final partition held out by shipment",
    SplitMethod.GROUP_KFOLD: "by shipment, K folds: each fold validated on shipments its training part does not hold; the final partition held out by shipment",
    SplitMethod.TIME: "by time: trained on earlier periods, validated on later shipments; the final partition is the latest period",
    SplitMethod.TIME_KFOLD: (
        "by time, forward-chained K folds: each fold validated on a period after all it trains on (the earliest period is never validated); "
        "the final partition is the latest period"
    ),
    SplitMethod.RANDOM: "by frame, at random: shipments cross partitions",
}

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
    # K validation folds of the non-final ids; with train_only, disjoint and covering train + validation once; () for one split
    folds: tuple[Ids, ...] = ()
    train_only: Ids = ()  # ids every fold trains on and none validates on (a time K-fold's earliest period)

    @property
    def fold_count(self) -> int:
        return len(self.folds) or 1

    def fold(self, index: int) -> tuple[Ids, Ids]:
        """(train ids, validation ids) of fold ``index``: its own fold to validate on; to train on, the
        other folds (grouped K-fold) or only the earlier ones (time K-fold), with ``train_only``. Of a
        split without folds, fold 0 is its train and validation partitions."""
        if not 0 <= index < self.fold_count:
            raise UsageError(f"{self.path} has {self.fold_count} fold(s); fold {index} does not exist")
        if not self.folds:
            return self.train, self.validation
        trained = self.folds[:index] if self.method.chains_folds() else self.folds[:index] + self.folds[index + 1 :]
        rest = [*self.train_only, *(i for part in trained for i in part)]
        return tuple(sorted(rest)), self.folds[index]

    def __post_init__(self) -> None:
        _check_ids(self.method, self.train, "train", self.path)
        _check_ids(self.method, self.validation, "validation", self.path)
        for k, part in enumerate(self.folds):
            _check_ids(self.method, part, f"fold {k}", self.path)
        if self.train_only:
            _check_ids(self.method, self.train_only, "train_only", self.path)
        if self.train_only and not self.folds:
            raise CorruptRecord(f"{self.path}: train_only needs folds; regenerate the split under a new revision")
        if self.folds and sorted([*self.train_only, *(i for part in self.folds for i in part)]) != sorted([*self.train, *self.validation]):
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


def assign_groups(ids: Sequence[str], seed: int, fractions: Sequence[float], together: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], ...]:
    """Shuffle the distinct ids with the seed and cut them into (train, validation, final); with
    ``together`` (each id's component, entities.py), whole components are shuffled and cut."""
    units = _units(ids, together)
    reps = sorted(units)
    parts = _cut(len(reps), seed, fractions, "shipments")
    return tuple(tuple(sorted(s for i in part for s in units[reps[i]])) for part in parts)


def assign_rows(n_rows: int, seed: int, fractions: Sequence[float]) -> tuple[tuple[int, ...], ...]:
    """Every row on its own: frames of one shipment land in different partitions."""
    return tuple(tuple(sorted(int(i) for i in part)) for part in _cut(n_rows, seed, fractions, "frames"))


def make_group_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int, fractions: Sequence[float] = (0.7, 0.15, 0.15), revision: str = "group_r8"
) -> SplitInfo:
    _check_seed(seed)
    made = _Source.read(snapshot_path)
    parts = assign_groups(made.entities.shipments.tolist(), seed, fractions, made.entities.together())
    return made.write(SplitMethod.GROUP, out_dir, revision, seed, parts, {"fractions": [float(x) for x in fractions]})


def assign_group_folds(
    ids: Sequence[str], seed: int, k: int, final_fraction: float, together: Mapping[str, str] | None = None
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Shuffle the distinct ids (or components, with ``together``) with the seed, hold out the final
    partition, cut the rest into ``k`` folds of as equal a number of units as can be: (final, folds)."""
    units = _units(ids, together)
    distinct = sorted(units)
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise UsageError(f"split.folds={k!r} must be an integer of at least 2 (one validation fold, one to train on)")
    n_final = max(1, math.floor(float(final_fraction) * len(distinct) + 0.5))
    if not 0 < final_fraction < 1 or len(distinct) - n_final < k:
        raise UsageError(
            f"{len(distinct)} shipments cannot give a final partition of {final_fraction} and {k} non-empty folds; use more shipments or fewer folds"
        )
    order = _permutation(len(distinct), seed)

    def members(picked) -> tuple[str, ...]:
        return tuple(sorted(s for i in picked for s in units[distinct[i]]))

    rest = order[: len(order) - n_final]
    return members(order[len(order) - n_final :]), tuple(members(rest[f::k]) for f in range(k))


def make_group_kfold_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int, folds: int = 5, final_fraction: float = 0.15, revision: str = "group_kfold_r1"
) -> SplitInfo:
    """The final partition held out by shipment as a group split does; the rest cut into ``folds``
    folds by shipment. The file's train and validation are fold 0's, so a reader that knows no
    folds sees one honest split."""
    _check_seed(seed)
    made = _Source.read(snapshot_path)
    final, parts = assign_group_folds(made.entities.shipments.tolist(), seed, folds, final_fraction, made.entities.together())
    train = tuple(sorted(i for part in parts[1:] for i in part))
    return made.write(SplitMethod.GROUP_KFOLD, out_dir, revision, seed, (train, parts[0], final), {"final_fraction": float(final_fraction)}, folds=parts)


def make_time_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, fractions: Sequence[float] = (0.7, 0.15, 0.15), revision: str = "time_r1"
) -> SplitInfo:
    """Train on the earliest shipments, validate on the later ones, hold the latest out as final
    (fractions count shipments; each boundary falls where no component straddles it, periods.py).
    Nothing is drawn at random: the file's seed is 0."""
    fr = _check_fractions(fractions)
    made = _Source.read(snapshot_path)
    parts = assign_periods(made.entities.shipments.tolist(), made.times(), made.entities.together(), fr)
    return made.write(SplitMethod.TIME, out_dir, revision, 0, parts, {"fractions": list(fr)})


def make_time_kfold_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, folds: int = 4, final_fraction: float = 0.15, revision: str = "time_kfold_r1"
) -> SplitInfo:
    """The latest shipments held out as final; the rest cut into ``folds + 1`` periods: the earliest
    only ever trained on, and fold i validating on period i + 1 after training on every period before
    it (forward chaining). The file's train and validation are the last fold's: a reader that knows
    no folds sees the time split nearest deployment."""
    shares = kfold_fractions(folds, final_fraction)
    made = _Source.read(snapshot_path)
    periods = assign_periods(made.entities.shipments.tolist(), made.times(), made.entities.together(), shares)
    head, parts, final = periods[0], periods[1:-1], periods[-1]
    train = tuple(sorted(i for part in (head, *parts[:-1]) for i in part))
    return made.write(
        SplitMethod.TIME_KFOLD, out_dir, revision, 0, (train, parts[-1], final), {"final_fraction": float(final_fraction)}, folds=parts, train_only=head
    )


def make_assigned_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, assignment: Mapping[str, str], *, revision: str, group_leaks: bool = False
) -> SplitInfo:
    """A group split whose partitions the user chose: ``assignment`` maps every shipment id to
    ``train``, ``validation`` or ``final``. One whose parcels (or declared groups) cross partitions is
    refused; ``group_leaks`` moves each crossing component whole into its latest partition instead."""
    made = _Source.read(snapshot_path)
    known = set(made.entities.shipments.tolist())
    missing, unknown = sorted(known - set(assignment)), sorted(set(assignment) - known)
    if missing or unknown:
        what = f"shipment {missing[0]!r} has no partition" if missing else f"shipment {unknown[0]!r} is not in the snapshot"
        raise UsageError(f"{what}; assign every shipment of {snapshot_path} to one of {list(_PARTS)}")
    bad = sorted(p for p in set(assignment.values()) if p not in _PARTS)
    if bad:
        raise UsageError(f"partition {bad[0]!r} is unknown; assign each shipment to one of {list(_PARTS)}")
    index = {s: _PARTS.index(p) for s, p in assignment.items()}
    if group_leaks:
        index = group_leaks_away(index, made.entities.together())
    parts = tuple(tuple(sorted(s for s, i in index.items() if i == k)) for k in range(len(_PARTS)))
    if not all(parts):
        raise UsageError(
            f"partition {_PARTS[[bool(p) for p in parts].index(False)]!r} would hold no shipment; assign at least one shipment to each of {list(_PARTS)}"
        )
    return made.write(SplitMethod.GROUP, out_dir, revision, 0, parts, {"assigned": True}, fix=_GROUP_AWAY)


def make_random_split(
    snapshot_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int, fractions: Sequence[float] = (0.7, 0.15, 0.15), revision: str = "random_r7"
) -> SplitInfo:
    _check_seed(seed)
    made = _Source.read(snapshot_path)
    parts = assign_rows(len(made.entities.shipments), seed, fractions)
    return made.write(SplitMethod.RANDOM, out_dir, revision, seed, parts, {"fractions": [float(x) for x in fractions]})


def read_split(path: str | os.PathLike) -> Split:
    """The split a trial is given, its digest recomputed from what was read."""
    c = _read_checked(path, SPLIT_FORMAT)
    try:
        return Split(
            method=_method(c, path),
            key=c["key"],
            revision=c["revision"],
            snapshot_digest=c["snapshot_digest"],
            seed=c["seed"],
            train=tuple(c["train"]),
            validation=tuple(c["validation"]),
            final_digest=c["final_digest"],
            digest=c[DIGEST_FIELD],
            path=str(path),
            folds=tuple(tuple(part) for part in c.get("folds", ())),
            train_only=tuple(c.get("train_only", ())),
        )
    except (KeyError, TypeError) as exc:
        raise CorruptRecord(f"{path} lacks field {exc}; regenerate the split under a new revision") from None


def read_final_record(path: str | os.PathLike) -> FinalRecord:
    """For load_final_partition only; a trial never has a reason to call this."""
    c = _read_checked(path, FINAL_FORMAT)
    try:
        return FinalRecord(
            method=_method(c, path),
            key=c["key"],
            revision=c["revision"],
            snapshot_digest=c["snapshot_digest"],
            final=tuple(c["final"]),
            digest=c[DIGEST_FIELD],
            path=str(path),
        )
    except (KeyError, TypeError) as exc:
        raise CorruptRecord(f"{path} lacks field {exc}; regenerate the split under a new revision") from None


def split_leak(entities: Entities, split: Split) -> Leak | None:
    """The first entity whose frames lie in more than one of the split's partitions (its folds, when
    it has them; whatever is in no fold or partition counts as final, so the final file stays shut)."""
    return _leak_of(entities, split.method, _named_parts(split))


def refuse_leaking_split(snapshot_path: str | os.PathLike, split: Split) -> None:
    """One line naming the entity, its partitions and the fix, for a split that leaks (made before
    splits were checked); a random split is governance's to reject, not this check's."""
    if split.method.leaks_shipments():
        return
    with open_snapshot(snapshot_path) as f:
        leak = split_leak(read_entities(f), split)
    if leak is not None:
        raise UsageError(
            f"split {split.path} leaks: {leak}; make a new split revision (`parcel-hpc make-snapshot`, make_group_split), which keeps connected shipments together"
        )


_PARTS = ("train", "validation", "final")
_GROUP_AWAY = "assign its shipments to one partition, or ask to group leaks away (group_leaks=True, --group-leaks) to move each crossing component into its latest partition"


@dataclass(frozen=True)
class _Source:
    """The snapshot a split is made from, read once (digest and entities); ``write`` writes the
    split's files only when no entity crosses its partitions (a random split leaks by design)."""

    path: str
    snapshot: str  # its content digest
    entities: Entities

    @classmethod
    def read(cls, snapshot_path: str | os.PathLike) -> _Source:
        with open_snapshot(snapshot_path) as f:
            return cls(str(snapshot_path), digest_open_snapshot(f), read_entities(f))

    def times(self) -> np.ndarray:
        if self.entities.capture_time is None:
            raise UsageError(f"snapshot {self.path} has no {CAPTURE_TIME} dataset; a time split needs each frame's capture time (docs/snapshot-format.md)")
        return self.entities.capture_time

    def write(
        self,
        method: SplitMethod,
        out_dir,
        revision: str,
        seed: int,
        parts: tuple[Ids, ...],
        extra: dict[str, Any],
        *,
        folds: tuple[Ids, ...] = (),
        train_only: Ids = (),
        fix: str = "",
    ) -> SplitInfo:
        split_path, final_path = split_paths(out_dir, revision)
        train, validation, final = parts
        if not method.leaks_shipments():
            named = ((("train only", train_only),) if train_only else ()) + tuple((f"fold {k}", p) for k, p in enumerate(folds))
            leak = _leak_of(self.entities, method, named or (("train", train), ("validation", validation)))
            if leak is not None:
                raise UsageError(f"split {revision} would leak: {leak}; {fix or 'report it: this split keeps components whole'}")
        common = {"method": method.value, "key": method.key, "revision": revision, "snapshot_digest": self.snapshot, "seed": seed}
        final_content = _sealed({"format": FINAL_FORMAT, **common, "final": list(final)})
        split_content = {"format": SPLIT_FORMAT, **common, **extra, "train": list(train), "validation": list(validation)}
        if folds:
            split_content["folds"] = [list(part) for part in folds]
        if train_only:
            split_content["train_only"] = list(train_only)
        split_content = _sealed({**split_content, "final_digest": final_content[DIGEST_FIELD]})
        return _write_split(method, revision, split_path, final_path, split_content, final_content, seed, (len(train), len(validation), len(final)))


def _named_parts(split: Split) -> tuple[tuple[str, Ids], ...]:
    if not split.folds:
        return (("train", split.train), ("validation", split.validation))
    return ((("train only", split.train_only),) if split.train_only else ()) + tuple((f"fold {k}", p) for k, p in enumerate(split.folds))


def _leak_of(entities: Entities, method: SplitMethod, parts: tuple[tuple[str, Ids], ...]) -> Leak | None:
    """The first leak among the named partitions, the frames in none of them named final."""
    names = [name for name, _ in parts] + ["final"]
    by_frame = np.arange(len(entities.shipments)) if method.key == ROW else entities.shipments
    index = {i: k for k, (_, ids) in enumerate(parts) for i in ids}
    labels = [index.get(i, len(parts)) for i in by_frame.tolist()]
    return find_leak(entities.columns, labels, names)


def _units(ids: Sequence[str], together: Mapping[str, str] | None) -> dict[str, list[str]]:
    """The units a group split shuffles: each component's shipments, under its name."""
    units: dict[str, list[str]] = {}
    for s in sorted(set(ids)):
        units.setdefault(together[s] if together is not None else s, []).append(s)
    return units


def _write_split(
    method: SplitMethod,
    revision: str,
    split_path: Path,
    final_path: Path,
    split_content: dict[str, Any],
    final_content: dict[str, Any],
    seed: int,
    counts: tuple[int, int, int],
) -> SplitInfo:
    ensure_dir(split_path.parent)
    _write_once(final_path, final_content)
    _write_once(split_path, split_content)
    return SplitInfo(
        method=method,
        revision=revision,
        split_path=str(split_path),
        final_path=str(final_path),
        split_digest=split_content[DIGEST_FIELD],
        final_digest=final_content[DIGEST_FIELD],
        snapshot_digest=split_content["snapshot_digest"],
        seed=seed,
        counts=counts,
    )


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
