"""The default data artifacts of a demo or a test: one synthetic snapshot and its splits.

Owns the fixed layout ``<out_dir>/parcels.h5``, ``split-group_r8.json`` / ``final-group_r8.json``
(the honest split by shipment), ``split-group_kfold_r1.json`` (the same boundary, K folds),
``split-time_r1.json`` and ``split-time_kfold_r1.json`` (by time: the past trains, later shipments
validate, the latest are final) with their final files, and ``split-random_r7.json`` /
``final-random_r7.json`` (the leaky one that governance must reject). Idempotent: running it again on
the same directory changes nothing. Must not: add behaviour of its own beyond calling the generator
and the splitters.
"""

from __future__ import annotations

import os

from parcel_hpc.data.split import SplitInfo, make_group_kfold_split, make_group_split, make_random_split, make_time_kfold_split, make_time_split
from parcel_hpc.data.synthetic import make_snapshot

GROUP_REVISION = "group_r8"
GROUP_KFOLD_REVISION = "group_kfold_r1"
TIME_REVISION = "time_r1"
TIME_KFOLD_REVISION = "time_kfold_r1"
RANDOM_REVISION = "random_r7"


def make_default_artifacts(out_dir: str | os.PathLike, seed: int = 0, *, reshipped: int = 0, drift: float = 0.0) -> dict[str, str]:
    """Write the snapshot and its splits; return their paths and digests (all strings).

    Keys: snapshot_path, snapshot_digest; for the group split split_path, split_digest,
    final_path, final_digest; for each other split the same four prefixed with its kind
    (random_, group_kfold_, time_, time_kfold_). ``reshipped`` and ``drift`` go to the generator.
    """
    snap = make_snapshot(out_dir, seed=seed, reshipped=reshipped, drift=drift)
    out = {"snapshot_path": snap.path, "snapshot_digest": snap.digest}
    splits = {
        "": make_group_split(snap.path, out_dir, seed=seed, revision=GROUP_REVISION),
        "random_": make_random_split(snap.path, out_dir, seed=seed, revision=RANDOM_REVISION),
        "group_kfold_": make_group_kfold_split(snap.path, out_dir, seed=seed, revision=GROUP_KFOLD_REVISION),
        "time_": make_time_split(snap.path, out_dir, revision=TIME_REVISION),
        "time_kfold_": make_time_kfold_split(snap.path, out_dir, revision=TIME_KFOLD_REVISION),
    }
    for prefix, info in splits.items():
        out.update(_paths(prefix, info))
    return out


def _paths(prefix: str, info: SplitInfo) -> dict[str, str]:
    return {
        f"{prefix}split_path": info.split_path,
        f"{prefix}split_digest": info.split_digest,
        f"{prefix}final_path": info.final_path,
        f"{prefix}final_digest": info.final_digest,
    }
