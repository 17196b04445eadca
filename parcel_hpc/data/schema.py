"""The parcel snapshot format (``parcel-snapshot/1``) and its validator.

Owns the names, dtypes and shapes a snapshot must have, and the one function that checks a file
against them (``validate_snapshot``), so a user's own snapshot of real images is held to exactly the
rules the synthetic generator follows. docs/snapshot-format.md is the user-facing description of
the same rules; keep the two in step.

Optional parts, each held to its rules when present: a ``capture_time`` column (time-ordered
splits) and a ``group_columns`` root attribute naming further per-frame id columns (entities a
split must never cut apart, as it never cuts a shipment or a parcel).

Must not: generate data, compute digests or read partitions (synthetic.py, digest.py, partition.py).
Every refusal is a one-line UsageError naming the dataset or attribute and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from parcel_hpc.errors import UsageError

SCHEMA_VERSION = "parcel-snapshot/1"
SNAPSHOT_FILENAME = "parcels.h5"

# The order here is the canonical order: the content digest hashes datasets in this order.
IMAGES = "images"
NEEDS_REVIEW = "needs_review"
SHIPMENT_ID = "shipment_id"
PARCEL_ID = "parcel_id"
FRAME = "frame"
DAMAGE_TYPE = "damage_type"
CAMERA_CLASS = "camera_class"
DATASETS = (IMAGES, NEEDS_REVIEW, SHIPMENT_ID, PARCEL_ID, FRAME, DAMAGE_TYPE, CAMERA_CLASS)
LABELLED = (DAMAGE_TYPE, CAMERA_CLASS)  # small-int codes with their names in a ``labels`` attribute
ID_COLUMNS = (SHIPMENT_ID, PARCEL_ID)  # fixed-length ASCII byte strings
LABELS_ATTR = "labels"
# Optional, digested when present: when each frame was captured (seconds; any epoch, only the order
# matters), for time-ordered splits. A snapshot without it keeps the digest it always had.
CAPTURE_TIME = "capture_time"
OPTIONAL_DATASETS = (CAPTURE_TIME,)
# Optional root attribute: the names of further per-frame id columns (ASCII, as the id columns) that
# group frames which must never be split apart, e.g. a customer or a production batch.
GROUP_COLUMNS_ATTR = "group_columns"

REQUIRED_ROOT_ATTRS = ("schema_version", "generator")
OPTIONAL_ROOT_ATTRS = ("seed",)  # synthetic snapshots only: a real snapshot has no seed

IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.float32))
MAX_ID_BYTES = 64
_ROWS_PER_CHECK = 1 << 16  # rows per block when checking the 1-D columns' values


@dataclass(frozen=True)
class SnapshotMeta:
    """What validation learned about a snapshot: enough to size a model and name the slices."""

    path: str
    n_frames: int
    image_shape: tuple[int, int]  # (height, width) in pixels
    image_dtype: str  # "uint8" (0..255) or "float32" (0..1)
    damage_labels: tuple[str, ...]  # damage_type code i is damage_labels[i]
    camera_labels: tuple[str, ...]  # camera_class code i is camera_labels[i]
    schema_version: str
    generator: str
    seed: int | None  # None for a snapshot that was not generated
    has_capture_time: bool = False  # the optional capture_time dataset is present
    group_columns: tuple[str, ...] = ()  # further id columns the snapshot declares (GROUP_COLUMNS_ATTR)

    def __post_init__(self) -> None:
        if self.n_frames <= 0:
            raise UsageError(f"snapshot {self.path} has no frames; {IMAGES} needs at least one image")


def attr_text(value: Any) -> str:
    """An HDF5 string attribute as ``str``, whether h5py hands back ``str``, ``bytes`` or a 0-d array."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, (str, np.str_)):
        return str(value)
    raise TypeError(type(value).__name__)


def label_names(ds: h5py.Dataset) -> tuple[str, ...]:
    """The ``labels`` attribute of a labelled column, checked: non-empty, unique, non-blank names."""
    fix = f"write it with ds.attrs['{LABELS_ATTR}'] = np.array(['name0', 'name1', ...], dtype='S')"
    if LABELS_ATTR not in ds.attrs:
        raise UsageError(f"dataset {ds.name.lstrip('/')} has no '{LABELS_ATTR}' attribute naming its codes; {fix}")
    raw = np.atleast_1d(np.asarray(ds.attrs[LABELS_ATTR]))
    try:
        names = tuple(attr_text(v) for v in raw)
    except (TypeError, UnicodeDecodeError):
        raise UsageError(f"dataset {ds.name.lstrip('/')} attribute '{LABELS_ATTR}' is not a list of strings; {fix}") from None
    if not names or any(not n.strip() for n in names) or len(set(names)) != len(names):
        raise UsageError(f"dataset {ds.name.lstrip('/')} attribute '{LABELS_ATTR}' must be unique non-blank names, got {list(names)}; {fix}")
    return names


def open_snapshot(path: str | os.PathLike) -> h5py.File:
    """Open read-only, turning 'missing' and 'not HDF5' into UsageErrors."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"snapshot {p} does not exist; generate one with make_snapshot() or pass the path of your parcels.h5")
    if not h5py.is_hdf5(p):
        raise UsageError(f"snapshot {p} is not an HDF5 file; write it with h5py (see docs/snapshot-format.md)")
    return h5py.File(p, "r")


def inspect_structure(f: h5py.File) -> SnapshotMeta:
    """Check names, dtypes, shapes and attributes without reading the data: cheap on any size."""
    where = f.filename
    root = _root_attrs(f)
    for name in DATASETS:
        if name not in f or not isinstance(f[name], h5py.Dataset):
            raise UsageError(f"snapshot {where} is missing dataset '{name}'; add it as described in docs/snapshot-format.md")
    images = f[IMAGES]
    if images.ndim != 3 or 0 in images.shape:
        raise UsageError(f"dataset {IMAGES} has shape {images.shape}; it must be (N, H, W) grayscale with N, H, W >= 1")
    if images.dtype not in IMAGE_DTYPES:
        raise UsageError(f"dataset {IMAGES} has dtype {images.dtype}; store uint8 (0..255) or float32 (0..1) pixels")
    n = images.shape[0]
    groups = _group_columns(f)
    has_time = CAPTURE_TIME in f
    for name in (*DATASETS[1:], *(opt for opt in OPTIONAL_DATASETS if opt in f), *groups):
        ds = f[name]
        if not isinstance(ds, h5py.Dataset) or ds.shape != (n,):
            raise UsageError(f"dataset {name} has shape {getattr(ds, 'shape', None)}; it must be ({n},), one value per image")
    _check_kind(f[NEEDS_REVIEW], "biu", "uint8 0/1 (or bool)")
    _check_kind(f[FRAME], "iu", "an integer frame index")
    if has_time:
        _check_kind(f[CAPTURE_TIME], "iuf", "capture times in seconds (integer or float)")
    for name in (*ID_COLUMNS, *groups):
        ds = f[name]
        if ds.dtype.kind != "S" or not 1 <= ds.dtype.itemsize <= MAX_ID_BYTES:
            raise UsageError(
                f"dataset {name} has dtype {ds.dtype}; store ids as fixed-length ASCII strings of at most {MAX_ID_BYTES} bytes, e.g. np.asarray(ids, dtype='S')"
            )
    for name in LABELLED:
        _check_kind(f[name], "iu", "small integer codes")
    return SnapshotMeta(
        path=str(where),
        n_frames=n,
        image_shape=(int(images.shape[1]), int(images.shape[2])),
        image_dtype=str(images.dtype),
        damage_labels=label_names(f[DAMAGE_TYPE]),
        camera_labels=label_names(f[CAMERA_CLASS]),
        schema_version=root["schema_version"],
        generator=root["generator"],
        seed=root.get("seed"),
        has_capture_time=has_time,
        group_columns=groups,
    )


def validate_snapshot(path: str | os.PathLike) -> SnapshotMeta:
    """Raise a one-line UsageError for the first problem found; return the snapshot's metadata.

    Structure first, then the values of the 1-D columns (read in blocks, so a large snapshot is
    never loaded whole). Pixel values are not scanned: a float32 image outside 0..1 is the user's
    choice of scale, not a format error.
    """
    with open_snapshot(path) as f:
        meta = inspect_structure(f)
        n_damage, n_camera = len(meta.damage_labels), len(meta.camera_labels)
        for start in range(0, meta.n_frames, _ROWS_PER_CHECK):
            rows = slice(start, start + _ROWS_PER_CHECK)
            _check_range(f[NEEDS_REVIEW][rows], NEEDS_REVIEW, 0, 1, "use 1 for needs review and 0 for not")
            _check_range(f[FRAME][rows], FRAME, 0, None, "number the frames of a parcel from 0")
            _check_range(f[DAMAGE_TYPE][rows], DAMAGE_TYPE, 0, n_damage - 1, f"codes index its labels {list(meta.damage_labels)}")
            _check_range(f[CAMERA_CLASS][rows], CAMERA_CLASS, 0, n_camera - 1, f"codes index its labels {list(meta.camera_labels)}")
            for name in (*ID_COLUMNS, *meta.group_columns):
                _check_ids(f[name][rows], name, start)
            if meta.has_capture_time:
                _check_finite(f[CAPTURE_TIME][rows], start)
    return meta


def _root_attrs(f: h5py.File) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in REQUIRED_ROOT_ATTRS:
        if key not in f.attrs:
            hint = f"'{SCHEMA_VERSION}'" if key == "schema_version" else "'<tool that wrote it> <version>'"
            raise UsageError(f"snapshot {f.filename} has no root attribute '{key}'; set f.attrs['{key}'] = {hint}")
        try:
            out[key] = attr_text(f.attrs[key])
        except (TypeError, UnicodeDecodeError):
            raise UsageError(f"snapshot {f.filename} root attribute '{key}' must be a string") from None
    if out["schema_version"] != SCHEMA_VERSION:
        raise UsageError(
            f"snapshot {f.filename} has schema_version {out['schema_version']!r}; this toolkit reads {SCHEMA_VERSION!r} "
            "(convert the file as described in docs/snapshot-format.md)"
        )
    if "seed" in f.attrs:
        seed = np.asarray(f.attrs["seed"])
        if seed.shape != () or seed.dtype.kind not in "iu":
            raise UsageError(f"snapshot {f.filename} root attribute 'seed' must be one integer; delete it for a real snapshot")
        out["seed"] = int(seed)
    return out


def _group_columns(f: h5py.File) -> tuple[str, ...]:
    """The declared group columns: distinct names of datasets other than the format's own."""
    if GROUP_COLUMNS_ATTR not in f.attrs:
        return ()
    fix = f"set f.attrs['{GROUP_COLUMNS_ATTR}'] = np.array(['customer_id', ...], dtype='S'), each naming a per-frame id dataset"
    try:
        names = tuple(attr_text(v) for v in np.atleast_1d(np.asarray(f.attrs[GROUP_COLUMNS_ATTR])))
    except (TypeError, UnicodeDecodeError):
        raise UsageError(f"snapshot {f.filename} root attribute '{GROUP_COLUMNS_ATTR}' is not a list of strings; {fix}") from None
    taken = set(DATASETS) | set(OPTIONAL_DATASETS)
    if not names or len(set(names)) != len(names) or any(not n or n in taken for n in names):
        raise UsageError(
            f"snapshot {f.filename} root attribute '{GROUP_COLUMNS_ATTR}' must name distinct datasets other than the format's own, got {list(names)}; {fix}"
        )
    for name in names:
        if name not in f:
            raise UsageError(
                f"snapshot {f.filename} declares group column '{name}' but has no such dataset; add it (one id per image) or drop it from '{GROUP_COLUMNS_ATTR}'"
            )
    return names


def _check_finite(values: np.ndarray, offset: int) -> None:
    bad = ~np.isfinite(values.astype(np.float64))
    if bad.any():
        raise UsageError(f"dataset {CAPTURE_TIME} row {offset + int(np.argmax(bad))} is not a finite number; give every image its capture time in seconds")


def _check_kind(ds: h5py.Dataset, kinds: str, what: str) -> None:
    if ds.dtype.kind not in kinds:
        raise UsageError(f"dataset {ds.name.lstrip('/')} has dtype {ds.dtype}; it must hold {what}")


def _check_range(values: np.ndarray, name: str, lo: int, hi: int | None, fix: str) -> None:
    values = values.astype(np.int64)
    bad = (values < lo) | (values > hi if hi is not None else False)
    if bad.any():
        i = int(np.argmax(bad))
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise UsageError(f"dataset {name} holds {int(values[i])}, outside {bound}; {fix}")


def _check_ids(values: np.ndarray, name: str, offset: int) -> None:
    blank = np.char.strip(values) == b""
    if blank.any():
        raise UsageError(f"dataset {name} row {offset + int(np.argmax(blank))} is empty; every image needs its {name}")
    try:
        np.char.decode(values, "ascii")
    except UnicodeDecodeError:
        raise UsageError(f"dataset {name} holds non-ASCII bytes; store ids as ASCII text") from None
