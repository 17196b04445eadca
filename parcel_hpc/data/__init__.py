"""Parcel snapshots: the HDF5 format, a synthetic generator, content digests and group splits.

A trial reads its data through ``read_split`` and ``load_partition`` only; the protected final
partition is reached only through ``load_final_partition``, by the one-time final evaluation.
The format is described for users in docs/snapshot-format.md.

    schema.py         the format (``parcel-snapshot/1``) and its validator
    synthetic.py      the synthetic snapshot (``_render.py`` draws its parcels)
    digest.py         content digests of a snapshot and of a JSON artifact
    entities.py       what a split must not cut apart (shipments joined by parcels), and its leaks
    periods.py        where time boundaries fall (time-ordered splits)
    split.py          group, K-fold, time and random splits and their files; the leak check
    partition.py      one partition of a snapshot read into memory
    artifacts.py      the default snapshot and splits of a demo or a test
    preprocessing.py  features by pinned revision, fitted on the train partition only
"""

from parcel_hpc.data.artifacts import GROUP_REVISION, RANDOM_REVISION, make_default_artifacts
from parcel_hpc.data.digest import json_digest, snapshot_digest
from parcel_hpc.data.partition import Partition, PartitionName, load_final_partition, load_partition
from parcel_hpc.data.schema import SCHEMA_VERSION, SNAPSHOT_FILENAME, SnapshotMeta, validate_snapshot
from parcel_hpc.data.entities import Entities, Leak, read_entities
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
