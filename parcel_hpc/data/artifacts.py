"""The default data artifacts of a demo or a test: one synthetic snapshot and its splits.

Owns the fixed layout ``<out_dir>/parcels.h5``, ``split-group_r8.json`` / ``final-group_r8.json``
(the honest split), ``split-group_kfold_r1.json`` / ``final-group_kfold_r1.json`` (the same kind cut
into five folds by shipment: conf/split/group_kfold_r1.yaml) and ``split-random_r7.json`` / ``final-random_r7.json`` (the leaky one that
governance must reject). Idempotent: running it again on the same directory changes nothing.
Must not: add behaviour of its own beyond calling the generator and the splitters.
"""

from __future__ import annotations

import os

from parcel_hpc.data.split import make_group_kfold_split, make_group_split, make_random_split
from parcel_hpc.data.synthetic import make_snapshot

GROUP_REVISION = "group_r8"
RANDOM_REVISION = "random_r7"
KFOLD_REVISION = "group_kfold_r1"


def make_default_artifacts(out_dir: str | os.PathLike, seed: int = 0) -> dict[str, str]:
    """Write the snapshot and its splits; return their paths and digests (all strings).

    Keys: snapshot_path, snapshot_digest; for the group split split_path, split_digest,
    final_path, final_digest; for the random split random_split_path, random_split_digest,
    random_final_path, random_final_digest; for the 5-fold split kfold_split_path, kfold_final_path.
    """
    snap = make_snapshot(out_dir, seed=seed)
    group = make_group_split(snap.path, out_dir, seed=seed, revision=GROUP_REVISION)
    rand = make_random_split(snap.path, out_dir, seed=seed, revision=RANDOM_REVISION)
    kfold = make_group_kfold_split(snap.path, out_dir, seed=seed, folds=5, revision=KFOLD_REVISION)
    return {
        "snapshot_path": snap.path,
        "snapshot_digest": snap.digest,
        "split_path": group.split_path,
        "split_digest": group.split_digest,
        "final_path": group.final_path,
        "final_digest": group.final_digest,
        "random_split_path": rand.split_path,
        "random_split_digest": rand.split_digest,
        "random_final_path": rand.final_path,
        "random_final_digest": rand.final_digest,
        "kfold_split_path": kfold.split_path,
        "kfold_final_path": kfold.final_path,
    }
