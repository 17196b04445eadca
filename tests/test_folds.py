"""A K-fold trial: each fold run's data, checkpoints, metric and pruning (issue 48's execution side)."""

import numpy as np
import pytest

from parcel_hpc.data import load_partition, read_split
from parcel_hpc.data.preprocessing import image_stats
from parcel_hpc.trainer import load_training_data

PREPROCESSING = {"revision": "stats-r1", "pool": 4}


def test_each_fold_fits_its_preprocessing_on_its_own_training_frames_only(artifacts):
    split = read_split(artifacts["kfold_split_path"])
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
