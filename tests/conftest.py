import shutil
from pathlib import Path

import pytest

from parcel_hpc.data import make_default_artifacts


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict:
    """The default synthetic snapshot and both splits, made once per test session."""
    out = tmp_path_factory.mktemp("data")
    paths = make_default_artifacts(out, seed=0)
    paths["dir"] = str(out)
    return paths


@pytest.fixture
def data_dir(artifacts, tmp_path) -> Path:
    """A private copy of the artifacts, for tests that change files."""
    dest = tmp_path / "data"
    shutil.copytree(artifacts["dir"], dest)
    return dest
