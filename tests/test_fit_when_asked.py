"""The pinned preprocessing is fitted when a trainer first asks for a feature or its statistics: a
trainer that learns its own features from the images never pays for it, and one that asks gets
exactly what an eager fit on the train partition gave."""

from __future__ import annotations

import os
import pickle
import signal
import threading

import numpy as np
import pytest

from parcel_hpc.data import read_split
from parcel_hpc.data.partition import load_partition
from parcel_hpc.data.preprocessing import Preprocessor
from parcel_hpc.errors import UsageError
from parcel_hpc.trainer.data import load_training_data
from parcel_hpc.trainer.preflight import few_examples

PREPROCESSING = {"revision": "stats-r1", "pool": 4}


@pytest.fixture
def fits(monkeypatch):
    """How many times the preprocessing was fitted."""
    count = [0]
    fit = Preprocessor.fit_transform.__func__  # type: ignore[attr-defined]

    def counted(cls, *args):
        count[0] += 1
        return fit(cls, *args)

    monkeypatch.setattr(Preprocessor, "fit_transform", classmethod(counted))
    return count


def test_images_alone_fit_nothing_and_a_feature_fits_once_what_an_eager_fit_gives(artifacts, fits):
    split = read_split(artifacts["split_path"])
    data = load_training_data(artifacts["snapshot_path"], split, PREPROCESSING)
    assert data.train.images.shape[0] > 0 and data.validation.images.shape[0] > 0
    assert fits[0] == 0  # a trainer of images: no fit
    train = load_partition(artifacts["snapshot_path"], split, "train", verify_digest=False)
    validation = load_partition(artifacts["snapshot_path"], split, "validation", verify_digest=False)
    eager, x_train = Preprocessor.fit_transform("stats-r1", 4, train.images)
    fits[0] = 0
    got = []
    threads = [threading.Thread(target=lambda: got.append(data.validation.features)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fits[0] == 1 and all(g is got[0] for g in got)  # once, whichever thread asked first
    assert np.array_equal(data.train.features, x_train) and np.array_equal(data.validation.features, eager(validation.images))
    assert np.array_equal(data.preprocessing.mean, eager.mean) and np.array_equal(data.preprocessing.std, eager.std)
    assert not data.train.features.flags.writeable and not data.validation.features.flags.writeable
    assert fits[0] == 1  # the statistics and both partitions' features: the one fit


def test_a_bad_preprocessing_is_said_where_the_data_is_loaded(artifacts):
    with pytest.raises(UsageError, match="does not divide"):
        load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "stats-r1", "pool": 7})
    with pytest.raises(UsageError, match="unknown to this worker"):
        load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "pool9-r1", "pool": 4})


def test_the_preflight_s_few_examples_and_a_pickled_copy_fit_only_when_asked(artifacts, fits):
    data = load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), PREPROCESSING)
    few = few_examples(data)
    assert len(few.train) == 32 and fits[0] == 0
    picked = few.train.features
    assert fits[0] == 1 and picked.shape == (32, data.train.features.shape[1]) and not picked.flags.writeable
    few_copy = pickle.loads(pickle.dumps(few))
    assert np.array_equal(few_copy.train.features, picked) and not few_copy.train.features.flags.writeable
    assert len(pickle.dumps(few.train)) < len(pickle.dumps(data.train)) / 4  # the picked rows, not the partition behind them
    copy = pickle.loads(pickle.dumps(data))  # a trainer handing its data to a process it spawns
    assert np.array_equal(copy.train.features, data.train.features) and fits[0] == 1
    assert copy.without_examples().preprocessing.revision == "stats-r1"


def test_a_child_forked_while_another_thread_fits_fits_for_itself(artifacts):
    """The lock a fitting thread holds at the fork is free in the child, which makes its own fit."""
    data = load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), PREPROCESSING)
    with data._preprocessing._lock:  # another thread, mid-fit
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a lock never freed ends the child (and fails the test), not the run
            os._exit(0 if data.train.features.shape[0] == len(data.train) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
