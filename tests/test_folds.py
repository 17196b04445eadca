"""A K-fold trial: each fold run's data, checkpoints, metric and pruning (issue 48's execution side)."""

import numpy as np
import pytest

from parcel_hpc.data import load_partition, read_split
from parcel_hpc.data.preprocessing import image_stats
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.metric import FoldScores
from parcel_hpc.ledger import AttemptEnd, Ended
from parcel_hpc.pruning import AsyncSuccessiveHalving, MilestoneStore, PruneAction, value_over_folds
from parcel_hpc.trainer import load_training_data

PREPROCESSING = {"revision": "stats-r1", "pool": 4}


def test_each_fold_fits_its_preprocessing_on_its_own_training_frames_only(artifacts):
    split = read_split(artifacts["group_kfold_split_path"])
    assert split.fold_count == 5
    whole = load_partition(artifacts["snapshot_path"], split, "train", verify_digest=False)  # fold 0's train
    everything = np.concatenate([whole.images, load_partition(artifacts["snapshot_path"], split, "validation", verify_digest=False).images])
    non_final_mean = image_stats(everything.astype(np.float64), 4).mean(axis=0)
    means = []
    for k in range(split.fold_count):
        data = load_training_data(artifacts["snapshot_path"], split, PREPROCESSING, verify_digest=False, fold=k)
        train_ids, validation_ids = split.fold(k)
        assert set(data.train.shipment_id) == set(train_ids) and set(data.validation.shipment_id) == set(validation_ids)
        raw = image_stats(data.train.images.astype(np.float64), 4)  # from this fold's training frames alone
        np.testing.assert_array_equal(data.preprocessing.mean, raw.mean(axis=0))
        np.testing.assert_array_equal(data.preprocessing.std, raw.std(axis=0) + 1e-6)
        assert not np.allclose(data.preprocessing.mean, non_final_mean)  # its validation fold's frames left out
        means.append(data.preprocessing.mean)
    assert all(not np.array_equal(means[0], m) for m in means[1:])


def test_a_split_without_folds_is_its_one_fold(artifacts):
    split = read_split(artifacts["split_path"])
    data = load_training_data(artifacts["snapshot_path"], split, PREPROCESSING, verify_digest=False)
    assert set(data.train.shipment_id) == set(split.train)
    with pytest.raises(Exception, match="fold 1 does not exist"):
        load_training_data(artifacts["snapshot_path"], split, PREPROCESSING, verify_digest=False, fold=1)


def test_a_fold_trial_is_compared_on_its_mean_over_the_folds_so_far_at_the_same_milestone():
    per_fold = [0.6, 0.3, 0.45, 0.9]
    mean = None
    for fold, value in enumerate(per_fold):
        mean = value_over_folds(mean, fold, value)
        assert mean == pytest.approx(sum(per_fold[: fold + 1]) / (fold + 1), abs=1e-15)
    assert value_over_folds(None, 0, 0.25) == 0.25  # fold 0: its own value, as a trial without folds
    assert value_over_folds(None, 2, 0.25) is None  # its fold 1 report withdrawn: not compared with peers that have it
    with pytest.raises(UsageError):
        value_over_folds(0.5, -1, 0.25)


def test_each_fold_run_has_its_own_peers_and_a_quarantine_reaches_every_fold_store(tmp_path):
    store = MilestoneStore(tmp_path, (10, 20))
    assert store.of_fold(None) is store and store.of_fold(0) is store
    pruner = AsyncSuccessiveHalving((10, 20), reduction_factor=2, min_peers=1)
    for trial, value in (("t0000", 0.2), ("t0001", 0.8)):
        store.of_fold(1).report(trial, 10, value, 1)
    store.report("t0002", 10, 0.1, 1)  # fold 0's peer: never fold 1's
    assert store.of_fold(1).peers(10) == {"t0000": 0.2, "t0001": 0.8}
    assert store.of_fold(1).decide(pruner, "t0001", 10).action is PruneAction.PRUNE
    assert [s.root for s in store.fold_stores()] == [tmp_path, tmp_path / "folds" / "1"]
    for s in store.fold_stores():
        s.invalidate_uses_of("t0000", "quarantine:test")
    assert not store.of_fold(1).decision_of("t0001", 10).valid and store.of_fold(1).peers(10) == {"t0001": 0.8}


def test_a_fold_trial_s_metric_is_the_mean_of_its_folds_with_their_spread():
    scores = FoldScores((0.5, 0.7, 0.6))
    assert scores.mean == pytest.approx(0.6) and scores.spread == pytest.approx(0.1)
    Ended(AttemptEnd.COMPLETED, metric=scores.mean, folds=scores.values)
    with pytest.raises(ValueError, match="mean over its folds"):
        Ended(AttemptEnd.COMPLETED, metric=0.5, folds=scores.values)
    for bad in ((0.5,), (0.5, float("nan"))):
        with pytest.raises(ValueError):
            FoldScores(bad)
