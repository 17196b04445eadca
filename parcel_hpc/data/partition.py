"""Reading one partition of a snapshot into memory, for a trial or for the final evaluation.

Owns the rule that the final partition has exactly one door: ``load_partition`` accepts only
train and validation (``PartitionName`` has no final member, and a Split carries no final ids), and
``load_final_partition`` — named so that a reviewer notices every call — reads the protected
final file for the one-time final evaluation.

Rows are read as contiguous runs, so a partition of a large snapshot costs its own size, not the
file's. Must not: write anything, or decide which rows belong where (split.py).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import h5py
import numpy as np

from parcel_hpc.data import schema as S
from parcel_hpc.data.digest import digest_open_snapshot
from parcel_hpc.data.split import ROW, FinalRecord, Ids, Split, read_final_record
from parcel_hpc.errors import UsageError


class PartitionName(enum.Enum):
    TRAIN = "train"
    VALIDATION = "validation"


FINAL = "final"
_SPAN_BYTES = 64 << 20  # read a partition's whole row span at once when it is at most this big


@dataclass(frozen=True)
class Partition:
    """One partition's frames; every array is read-only and has one entry per frame."""

    name: str  # "train", "validation" or "final"
    revision: str
    snapshot_digest: str
    rows: np.ndarray  # int64 row numbers in the snapshot, increasing
    images: np.ndarray  # float32 (n, H, W); uint8 snapshots are scaled to 0..1
    labels: np.ndarray  # bool (n,): needs_review
    damage_type: np.ndarray  # str (n,)
    camera_class: np.ndarray  # str (n,)
    shipment_id: np.ndarray  # str (n,)
    parcel_id: np.ndarray  # str (n,)
    frame: np.ndarray  # int64 (n,)
    damage_labels: tuple[str, ...]  # every damage type of the snapshot, also those absent here
    camera_labels: tuple[str, ...]

    def __post_init__(self) -> None:
        n = len(self.rows)
        if n == 0:
            raise UsageError(f"{self.name} partition of split {self.revision} is empty; regenerate the split")
        for field in ("images", "labels", "damage_type", "camera_class", "shipment_id", "parcel_id", "frame"):
            arr = getattr(self, field)
            if len(arr) != n:
                raise ValueError(f"Partition.{field} has {len(arr)} entries for {n} rows")
            arr.flags.writeable = False
        self.rows.flags.writeable = False

    def __len__(self) -> int:
        return len(self.rows)


def load_partition(snapshot_path: str | os.PathLike, split: Split, partition: PartitionName | str, *, verify_digest: bool = True, fold: int = 0) -> Partition:
    """Train or validation frames of ``split``'s fold ``fold`` (``Split.fold``: of a split without
    folds, its train and validation); the final partition cannot be asked for here.

    ``verify_digest`` re-hashes the snapshot and refuses one the split was not made from; skip it
    only where the caller has just verified the same file (it reads the whole snapshot).
    """
    name = _partition_name(partition)
    ids = split.fold(fold)[0 if name is PartitionName.TRAIN else 1]
    return _load(snapshot_path, split.key, ids, name.value, split.revision, split.snapshot_digest, verify_digest)


def load_final_partition(snapshot_path: str | os.PathLike, final_path: str | os.PathLike, *, split: Split | None = None) -> Partition:
    """The protected final partition, for the one-time final evaluation only. Never call from a trial.

    With ``split``, also checks that the final file is the one that split was sealed with.
    """
    final: FinalRecord = read_final_record(final_path)
    if split is not None and (split.final_digest != final.digest or split.revision != final.revision):
        raise UsageError(
            f"{final_path} ({final.revision}, {final.digest}) is not the final partition of split "
            f"{split.revision} ({split.final_digest}); pass final-{split.revision}.json"
        )
    return _load(snapshot_path, final.key, final.final, FINAL, final.revision, final.snapshot_digest, True)


def _partition_name(partition: PartitionName | str) -> PartitionName:
    if isinstance(partition, PartitionName):
        return partition
    try:
        return PartitionName(partition)
    except ValueError:
        pass
    if partition == FINAL:
        raise UsageError("the final partition is not loaded by trials; only the one-time final evaluation reads it (load_final_partition)")
    raise UsageError(f"partition {partition!r} is unknown; use 'train' or 'validation'")


def _load(snapshot_path, key: str, ids: Ids, name: str, revision: str, expected_digest: str, verify: bool) -> Partition:
    with S.open_snapshot(snapshot_path) as f:
        meta = S.inspect_structure(f)
        if verify:
            found = digest_open_snapshot(f)
            if found != expected_digest:
                raise UsageError(
                    f"snapshot {snapshot_path} has digest {found} but split {revision} was made from {expected_digest}; "
                    "pass the snapshot the split was made from, or make a new split"
                )
        rows = _select_rows(f, key, ids, meta.n_frames, revision)
        damage = np.asarray(meta.damage_labels)[_read_rows(f[S.DAMAGE_TYPE], rows).astype(np.int64)]
        camera = np.asarray(meta.camera_labels)[_read_rows(f[S.CAMERA_CLASS], rows).astype(np.int64)]
        images = _read_rows(f[S.IMAGES], rows)
        if images.dtype == np.uint8:
            images = np.divide(images, 255.0, dtype=np.float32)  # correctly rounded: same floats everywhere
        return Partition(
            name=name,
            revision=revision,
            snapshot_digest=expected_digest,
            rows=rows,
            images=images,
            labels=_read_rows(f[S.NEEDS_REVIEW], rows).astype(bool),
            damage_type=damage,
            camera_class=camera,
            shipment_id=np.char.decode(_read_rows(f[S.SHIPMENT_ID], rows), "ascii"),
            parcel_id=np.char.decode(_read_rows(f[S.PARCEL_ID], rows), "ascii"),
            frame=_read_rows(f[S.FRAME], rows).astype(np.int64),
            damage_labels=meta.damage_labels,
            camera_labels=meta.camera_labels,
        )


def _select_rows(f: h5py.File, key: str, ids: Ids, n_frames: int, revision: str) -> np.ndarray:
    if key == ROW:
        rows = np.asarray(sorted(ids), dtype=np.int64)
        if rows[-1] >= n_frames:
            raise UsageError(f"split {revision} names row {rows[-1]} but the snapshot has {n_frames} rows; pass the snapshot the split was made from")
        return rows
    column = f[key][:]
    wanted = np.asarray(ids, dtype="S")
    present = np.isin(wanted, column)
    if not present.all():
        missing = wanted[~present][0].decode("ascii")
        raise UsageError(f"split {revision} names {key} {missing!r}, which the snapshot lacks; pass the snapshot the split was made from")
    return np.flatnonzero(np.isin(column, wanted)).astype(np.int64)


def _read_rows(ds: h5py.Dataset, rows: np.ndarray) -> np.ndarray:
    """``ds[rows]`` for increasing rows: one read of the covering span when that is cheap, else one per run."""
    first, last = int(rows[0]), int(rows[-1])
    row_bytes = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
    if (last - first + 1) * row_bytes <= max(_SPAN_BYTES, 2 * len(rows) * row_bytes):
        return ds[first : last + 1][rows - first]
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(rows)]))
    out = np.empty((len(rows),) + ds.shape[1:], dtype=ds.dtype)
    for a, b in zip(starts.tolist(), ends.tolist()):
        out[a:b] = ds[int(rows[a]) : int(rows[b - 1]) + 1]
    return out
