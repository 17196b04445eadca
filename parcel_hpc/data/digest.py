"""Content digests: of a snapshot (what the pixels and columns are) and of a JSON artifact.

Owns the rule that a digest names content, never a file: the snapshot digest hashes a canonical
header (format tag, root attributes, each dataset's name, little-endian dtype, shape and label
names) followed by each dataset's bytes in the schema's order (then the optional ``capture_time``
and the declared group columns, each only when present), read in row blocks so a large
real snapshot is never held in memory. Path, mtime, HDF5 chunking, compression and file layout
do not enter it; one changed pixel does.

Must not: validate values (schema.py) or write files.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import h5py
import numpy as np

from parcel_hpc.data.schema import DATASETS, GROUP_COLUMNS_ATTR, LABELLED, OPTIONAL_DATASETS, inspect_structure, label_names, open_snapshot
from parcel_hpc.fsio import canonical_json

DIGEST_FORMAT = "parcel-snapshot-digest/1"
DIGEST_FIELD = "digest"
_BLOCK_BYTES = 8 << 20  # rows are hashed in blocks of about this many bytes


def snapshot_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` of the snapshot's content (see the module docstring for what enters it)."""
    with open_snapshot(path) as f:
        return digest_open_snapshot(f)


def digest_open_snapshot(f: h5py.File) -> str:
    meta = inspect_structure(f)
    attrs: dict[str, Any] = {"schema_version": meta.schema_version, "generator": meta.generator, "seed": meta.seed}
    if meta.group_columns:  # only when declared: a snapshot without the optional parts keeps its digest
        attrs[GROUP_COLUMNS_ATTR] = list(meta.group_columns)
    hashed = (*DATASETS, *(name for name in OPTIONAL_DATASETS if name in f), *meta.group_columns)
    header = {"format": DIGEST_FORMAT, "attrs": attrs, "datasets": [_describe(f[name]) for name in hashed]}
    h = hashlib.sha256(canonical_json(header).encode("ascii"))
    for name in hashed:
        _hash_rows(h, f[name])
    return "sha256:" + h.hexdigest()


def json_digest(content: dict[str, Any]) -> str:
    """``sha256:<hex>`` of a JSON artifact's canonical text, its own ``digest`` field left out."""
    body = {k: v for k, v in content.items() if k != DIGEST_FIELD}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()


def _canonical_dtype(dtype: np.dtype) -> np.dtype:
    # A big-endian file and a little-endian file holding the same numbers are the same content.
    return dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype


def _describe(ds: h5py.Dataset) -> dict[str, Any]:
    name = ds.name.lstrip("/")
    out: dict[str, Any] = {"name": name, "dtype": _canonical_dtype(ds.dtype).str, "shape": list(ds.shape)}
    if name in LABELLED:
        out["labels"] = list(label_names(ds))
    return out


def _hash_rows(h: hashlib._Hash, ds: h5py.Dataset) -> None:
    n = ds.shape[0]
    row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
    step = max(1, _BLOCK_BYTES // row_bytes)
    target = _canonical_dtype(ds.dtype)
    for start in range(0, n, step):
        block = np.ascontiguousarray(ds[start : start + step], dtype=target)
        h.update(memoryview(block).cast("B"))  # type: ignore[arg-type]  # numpy declares ndarray.__buffer__ only for Python >= 3.12
