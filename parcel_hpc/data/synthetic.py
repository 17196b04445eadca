"""The synthetic parcel snapshot: ``make_snapshot`` writes ``<out_dir>/parcels.h5``.

Owns turning a seed into a ``parcel-snapshot/1`` file: ids, label names, root attributes, and a
write that is whole or absent (temp file, fsync, rename). A snapshot is immutable once written:
asking again for the same snapshot in the same place is a no-op, asking for a different one where
a snapshot already lies is refused, because trials may be reading it.

Must not: decide what parcels look like (_render.py) or define the format (schema.py).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import cast

import h5py
import numpy as np

from parcel_hpc.data import schema as S
from parcel_hpc.data._render import CAMERA_LABELS, DAMAGE_LABELS, render
from parcel_hpc.data.digest import snapshot_digest
from parcel_hpc.errors import UsageError
from parcel_hpc.fsio import FILE_MODE, canonical_json, ensure_dir, fsync_dir

GENERATOR = "parcel_hpc.data.synthetic/2"  # bump when the same seed would draw different parcels


@dataclass(frozen=True)
class SnapshotInfo:
    path: str
    digest: str  # "sha256:<hex>" content digest
    seed: int
    n_frames: int
    n_parcels: int
    n_shipments: int
    image_shape: tuple[int, int]  # (height, width) in pixels
    size_bytes: int  # of the HDF5 file
    seconds: float  # wall time to render and write; 0.0 when the file already existed
    damage_frames: tuple[tuple[str, int], ...]  # frames per damage type, in label order
    camera_frames: tuple[tuple[str, int], ...]  # frames per camera class, in label order

    def __post_init__(self) -> None:
        if not self.digest.startswith("sha256:"):
            raise ValueError(f"digest {self.digest!r} is not sha256:<hex>")
        if sum(n for _, n in self.damage_frames) != self.n_frames:
            raise ValueError("damage_frames does not add up to n_frames")


def make_snapshot(
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    n_shipments: int = 72,
    parcels_per_shipment: tuple[int, int] = (4, 10),
    frames_per_parcel: int = 3,
    image_size: int = 32,
    label_noise: float = 0.02,
    reshipped: int = 0,
    drift: float = 0.0,
    clock=time.perf_counter,
) -> SnapshotInfo:
    """Write a deterministic synthetic snapshot; the same arguments give the same digest anywhere.

    Every frame gets a capture time (shipments arrive in order). ``reshipped`` parcels appear again
    in a later shipment; with ``drift`` (0..1) the last 30% x drift of the shipments come after a
    switch of lighting and review policy (see _render.py)."""
    _check_args(seed, n_shipments, parcels_per_shipment, frames_per_parcel, image_size, label_noise)
    if isinstance(reshipped, bool) or not isinstance(reshipped, int) or reshipped < 0:
        raise UsageError(f"reshipped is {reshipped!r}; give how many parcels to ship again, 0 or more")
    if not 0.0 <= drift <= 1.0:
        raise UsageError(f"drift is {drift!r}; give 0 (none) to 1 (the last 30% of the shipments come after a switch of lighting and review policy)")
    out = ensure_dir(out_dir)
    target = out / S.SNAPSHOT_FILENAME
    t0 = clock()
    r = render(
        seed, n_shipments, cast(tuple[int, int], tuple(parcels_per_shipment)), frames_per_parcel, image_size, label_noise, reshipped, drift
    )  # _check_args: two ints
    params = dict(
        n_shipments=n_shipments,
        parcels_per_shipment=list(parcels_per_shipment),
        frames_per_parcel=frames_per_parcel,
        image_size=image_size,
        label_noise=label_noise,
        reshipped=reshipped,
        drift=drift,
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=out)
    os.close(fd)
    try:
        _write(tmp, r, seed, params)
        digest = snapshot_digest(tmp)
        seconds = clock() - t0
        if target.exists():
            existing = snapshot_digest(target)
            if existing != digest:
                raise UsageError(f"{target} already holds a different snapshot ({existing}); pick another out_dir or move it aside")
            seconds = 0.0
        else:
            os.replace(tmp, target)
            fsync_dir(out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return SnapshotInfo(
        path=str(target),
        digest=digest,
        seed=seed,
        n_frames=int(r.images.shape[0]),
        n_parcels=len(np.unique(r.identity)),
        n_shipments=n_shipments,
        image_shape=(image_size, image_size),
        size_bytes=target.stat().st_size,
        seconds=seconds,
        damage_frames=_counts(r.damage_type, DAMAGE_LABELS),
        camera_frames=_counts(r.camera_class, CAMERA_LABELS),
    )


def shipment_name(i: int) -> str:
    return f"SHP-{i:04d}"


def _write(path: str, r, seed: int, params: dict) -> None:
    ship_ids = np.array([shipment_name(i).encode() for i in range(int(r.shipment_index.max()) + 1)])
    shipment_id = ship_ids[r.shipment_index]
    # A parcel's id names the shipment it first travelled in: a re-shipped parcel keeps it.
    first = np.zeros(int(r.parcel_index.max()) + 1, dtype=np.int64)
    first[r.parcel_index] = np.arange(len(r.parcel_index))  # a frame of each parcel slot
    parcel_id = np.char.add(
        np.char.add(ship_ids[r.shipment_index[first[r.identity]]], b"-P"), np.char.zfill(r.parcel_in_shipment[first[r.identity]].astype("S2"), 2)
    )
    columns = {
        S.IMAGES: r.images,
        S.NEEDS_REVIEW: r.needs_review,
        S.SHIPMENT_ID: shipment_id,
        S.PARCEL_ID: parcel_id,
        S.FRAME: r.frame,
        S.DAMAGE_TYPE: r.damage_type,
        S.CAMERA_CLASS: r.camera_class,
        S.CAPTURE_TIME: r.capture_time,
    }
    labels = {S.DAMAGE_TYPE: DAMAGE_LABELS, S.CAMERA_CLASS: CAMERA_LABELS}
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = S.SCHEMA_VERSION
        f.attrs["generator"] = GENERATOR
        f.attrs["seed"] = np.int64(seed)
        f.attrs["generator_params"] = canonical_json(params)  # lineage only; the digest covers the pixels
        for name in (*S.DATASETS, S.CAPTURE_TIME):
            ds = f.create_dataset(name, data=columns[name], track_times=False)
            if name in labels:
                ds.attrs[S.LABELS_ATTR] = np.array(labels[name], dtype="S")
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    os.chmod(path, FILE_MODE)


def _counts(codes: np.ndarray, names: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    found = np.bincount(codes, minlength=len(names))
    return tuple((name, int(found[i])) for i, name in enumerate(names))


def _check_args(seed, n_shipments, pps, frames, size, noise) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}")
    if n_shipments < 3:
        raise UsageError(f"n_shipments is {n_shipments}; a group split needs at least 3 shipments")
    if len(pps) != 2 or not 1 <= pps[0] <= pps[1] or pps[1] > 99:
        raise UsageError(f"parcels_per_shipment is {pps!r}; give (low, high) with 1 <= low <= high <= 99")
    if frames < 1:
        raise UsageError(f"frames_per_parcel is {frames}; it must be at least 1")
    if not 24 <= size <= 256:
        raise UsageError(f"image_size is {size}; use 24..256 pixels (the parcel box needs room)")
    if not 0.0 <= noise < 0.5:
        raise UsageError(f"label_noise is {noise}; it must be in [0, 0.5)")
