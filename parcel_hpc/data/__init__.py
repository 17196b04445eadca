"""Parcel snapshots: the HDF5 format, a synthetic generator, content digests and group splits.

A trial reads its data through ``read_split`` and ``load_partition`` only; the protected final
partition is reached only through ``load_final_partition``, by the one-time final evaluation.
The format is described for users in docs/snapshot-format.md.

    schema.py         the format (``parcel-snapshot/1``) and its validator
    synthetic.py      the synthetic snapshot (``_render.py`` draws its parcels)
    digest.py         content digests of a snapshot and of a JSON artifact
    entities.py       what a split must not cut apart (shipments joined by parcels), and its leaks
    periods.py        where time boundaries fall (time-ordered splits)
    files.py          where a split revision's two files are
    split.py          group, K-fold, time and random splits and their files; the leak check
    partition.py      one partition of a snapshot read into memory
    artifacts.py      the default snapshot and splits of a demo or a test
    preprocessing.py  features by pinned revision, fitted on the train partition only

Names resolve on first use: the ledger's readers and the read commands import a module of this
package (``files.py``), which would otherwise load numpy and h5py for every ``status``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parcel_hpc.data.artifacts import GROUP_REVISION, RANDOM_REVISION, make_default_artifacts
    from parcel_hpc.data.digest import json_digest, snapshot_digest
    from parcel_hpc.data.entities import Entities, Leak, read_entities
    from parcel_hpc.data.partition import Partition, PartitionName, load_final_partition, load_partition
    from parcel_hpc.data.schema import SCHEMA_VERSION, SNAPSHOT_FILENAME, SnapshotMeta, validate_snapshot
    from parcel_hpc.data.split import (
        Split,
        SplitInfo,
        SplitMethod,
        assign_group_folds,
        assign_groups,
        assign_rows,
        make_assigned_split,
        make_group_kfold_split,
        make_group_split,
        make_random_split,
        make_time_kfold_split,
        make_time_split,
        read_split,
        refuse_leaking_split,
        split_leak,
    )
    from parcel_hpc.data.synthetic import SnapshotInfo, make_snapshot

_PUBLIC = {
    "Entities": "parcel_hpc.data.entities",
    "GROUP_REVISION": "parcel_hpc.data.artifacts",
    "Leak": "parcel_hpc.data.entities",
    "Partition": "parcel_hpc.data.partition",
    "PartitionName": "parcel_hpc.data.partition",
    "RANDOM_REVISION": "parcel_hpc.data.artifacts",
    "SCHEMA_VERSION": "parcel_hpc.data.schema",
    "SNAPSHOT_FILENAME": "parcel_hpc.data.schema",
    "SnapshotInfo": "parcel_hpc.data.synthetic",
    "SnapshotMeta": "parcel_hpc.data.schema",
    "Split": "parcel_hpc.data.split",
    "SplitInfo": "parcel_hpc.data.split",
    "SplitMethod": "parcel_hpc.data.split",
    "assign_group_folds": "parcel_hpc.data.split",
    "assign_groups": "parcel_hpc.data.split",
    "assign_rows": "parcel_hpc.data.split",
    "json_digest": "parcel_hpc.data.digest",
    "load_final_partition": "parcel_hpc.data.partition",
    "load_partition": "parcel_hpc.data.partition",
    "make_assigned_split": "parcel_hpc.data.split",
    "make_default_artifacts": "parcel_hpc.data.artifacts",
    "make_group_kfold_split": "parcel_hpc.data.split",
    "make_group_split": "parcel_hpc.data.split",
    "make_random_split": "parcel_hpc.data.split",
    "make_snapshot": "parcel_hpc.data.synthetic",
    "make_time_kfold_split": "parcel_hpc.data.split",
    "make_time_split": "parcel_hpc.data.split",
    "read_entities": "parcel_hpc.data.entities",
    "read_split": "parcel_hpc.data.split",
    "refuse_leaking_split": "parcel_hpc.data.split",
    "snapshot_digest": "parcel_hpc.data.digest",
    "split_leak": "parcel_hpc.data.split",
    "validate_snapshot": "parcel_hpc.data.schema",
}

__all__ = [
    "GROUP_REVISION",
    "Entities",
    "Leak",
    "RANDOM_REVISION",
    "SCHEMA_VERSION",
    "SNAPSHOT_FILENAME",
    "Partition",
    "PartitionName",
    "SnapshotInfo",
    "SnapshotMeta",
    "Split",
    "SplitInfo",
    "SplitMethod",
    "assign_group_folds",
    "assign_groups",
    "assign_rows",
    "json_digest",
    "load_final_partition",
    "load_partition",
    "make_assigned_split",
    "make_default_artifacts",
    "make_group_kfold_split",
    "make_group_split",
    "make_random_split",
    "make_snapshot",
    "make_time_kfold_split",
    "make_time_split",
    "read_entities",
    "read_split",
    "refuse_leaking_split",
    "snapshot_digest",
    "split_leak",
    "validate_snapshot",
]


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them stays an error, not Any

    def __getattr__(name: str) -> Any:
        if name in _PUBLIC:
            return getattr(importlib.import_module(_PUBLIC[name]), name)
        raise AttributeError(f"module 'parcel_hpc.data' has no attribute {name!r}")
