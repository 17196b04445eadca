import os
import shutil
import subprocess
from pathlib import Path

import pytest
from clusters import cluster, fake_slurm  # noqa: F401 (fixtures every test may ask for)

from parcel_hpc.data import make_default_artifacts, read_split
from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import faults, launch
from parcel_hpc.trainer import TrainingData, load_training_data
from parcel_hpc.worker.training import STEP_HOOK_ENV


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict:
    """The default synthetic snapshot and both splits, made once per test session."""
    out = tmp_path_factory.mktemp("data")
    paths = make_default_artifacts(out, seed=0)
    paths["dir"] = str(out)
    return paths


@pytest.fixture(scope="session")
def nvml_dir(tmp_path_factory) -> Path:
    """A directory holding libnvidia-ml.so.1, the fake driver library built from tests/fakes/fake_nvml.c
    (LD_LIBRARY_PATH finds it)."""
    out = tmp_path_factory.mktemp("nvml")
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the fake NVML library (scripts/test.sh installs gcc)"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out / "libnvidia-ml.so.1"), str(Path(__file__).parent / "fakes" / "fake_nvml.c")], check=True)
    return out


@pytest.fixture(scope="module")
def training_data(artifacts) -> TrainingData:
    """The default snapshot's training data as a trainer is given it (stats_r1 preprocessing), once per module."""
    return load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "stats-r1", "pool": 4})


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory, artifacts) -> Path:
    """A small finished search made once per session for tests that damage it: four trials, two
    completed and two failed (they raise at step 5: ``logs`` has tracebacks), with milestones, prune
    decisions, a budget journal and submitit's files. Copy it before changing anything in it."""
    top = tmp_path_factory.mktemp("finished")
    overrides = [f"search.root={top / 'runs'}", "search.revision=finished-r1", "search.n_trials=4"]
    overrides += ["+space.params.fault={type:choice,values:[none,ok,fine,raise]}", faults.TRAINER]
    res = launch(overrides, cwd=top, data_dir=Path(artifacts["dir"]), env={STEP_HOOK_ENV: faults.HOOK})
    assert res.returncode == 0, res.stderr[-2000:]
    search = top / "runs" / "finished-r1"
    assert {r.state.value for r in SearchDir(search).records()} == {"completed", "failed"}
    return search


@pytest.fixture
def data_dir(artifacts, tmp_path) -> Path:
    """A private copy of the artifacts, for tests that change files."""
    dest = tmp_path / "data"
    shutil.copytree(artifacts["dir"], dest)
    return dest


# The fast tier (scripts/test.sh --fast, `-m fast`): the modules tests/fast-tier.txt lists (why those, there).
FAST_MODULES = frozenset(
    (Path(__file__).parent / line.strip()).resolve()
    for line in Path(__file__).with_name("fast-tier.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)


# scripts/test.sh starts a second dev cluster and names its slurm.conf here: the slurm-marked tests of the
# modules tests/second-cluster.txt lists run on it, one worker driving each cluster, so the cluster tests
# (which mostly wait on the scheduler) take half the time. Without it every one runs on SLURM_CONF's.
SECOND_CLUSTER_CONF = os.environ.get("PARCEL_SECOND_SLURM_CONF", "")
FIRST_CLUSTER_CONF = os.environ.get("SLURM_CONF", "")
SECOND_CLUSTER_MODULES = frozenset(
    (Path(__file__).parent / line.strip()).resolve()
    for line in Path(__file__).with_name("second-cluster.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
SECOND_CLUSTER_GROUP = "cluster-2"


@pytest.hookimpl(wrapper=True)  # around every other impl: pytest-xdist turns the groups into node ids in its own
def pytest_collection_modifyitems(config, items):
    # One worker at a time drives a dev cluster (tests set nodes down, preempt, restart daemons);
    # the other tests spread over the remaining workers (scripts/test.sh: pytest-xdist --dist loadgroup).
    selected_scale = "scale" in (config.getoption("markexpr") or "")
    for item in items:
        path = Path(item.path).resolve()
        if path in FAST_MODULES and not item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.fast)  # before the other impls: `-m fast` selects it
        if item.get_closest_marker("slurm") and SECOND_CLUSTER_CONF and path in SECOND_CLUSTER_MODULES:
            item.add_marker(pytest.mark.xdist_group(SECOND_CLUSTER_GROUP))
        elif item.get_closest_marker("slurm") or "scale" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("cluster"))
        if "scale" in item.keywords and not selected_scale:
            item.add_marker(pytest.mark.skip(reason="run apart: bash scripts/test.sh -m scale tests/scale (about 18 minutes on 2 cores)"))
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before any fixture of the test, its module's too: the test, its fixtures and every process they
    # start talk to the dev cluster of the test's group.
    if SECOND_CLUSTER_CONF:
        group = item.get_closest_marker("xdist_group")
        second = group is not None and SECOND_CLUSTER_GROUP in (*group.args, group.kwargs.get("name"))
        os.environ["SLURM_CONF"] = SECOND_CLUSTER_CONF if second else FIRST_CLUSTER_CONF
