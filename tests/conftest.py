import shutil
from pathlib import Path

import pytest

from parcel_hpc.data import make_default_artifacts, read_split
from parcel_hpc.trainer import TrainingData, load_training_data


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict:
    """The default synthetic snapshot and both splits, made once per test session."""
    out = tmp_path_factory.mktemp("data")
    paths = make_default_artifacts(out, seed=0)
    paths["dir"] = str(out)
    return paths


@pytest.fixture(scope="module")
def training_data(artifacts) -> TrainingData:
    """The default snapshot's training data as a trainer is given it (stats_r1 preprocessing), once per module."""
    return load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "stats-r1", "pool": 4})


@pytest.fixture
def data_dir(artifacts, tmp_path) -> Path:
    """A private copy of the artifacts, for tests that change files."""
    dest = tmp_path / "data"
    shutil.copytree(artifacts["dir"], dest)
    return dest


@pytest.hookimpl(wrapper=True)  # around every other impl: pytest-xdist turns the groups into node ids in its own
def pytest_collection_modifyitems(config, items):
    # One worker at a time drives the dev cluster (tests set nodes down, preempt, restart daemons);
    # the other tests spread over the remaining workers (scripts/test.sh: pytest-xdist --dist loadgroup).
    selected_scale = "scale" in (config.getoption("markexpr") or "")
    for item in items:
        if "slurm" in item.keywords or "scale" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("cluster"))
        if "scale" in item.keywords and not selected_scale:
            item.add_marker(pytest.mark.skip(reason="run apart: bash scripts/test.sh -m scale tests/scale (about 18 minutes on 2 cores)"))
    return (yield)
