"""Which SLURM a test runs on: the fake one (``parcel_hpc.testing.fakeslurm``, the fast tier) or the
real dev cluster (``slurm``-marked). ``ON_BOTH`` parametrises a test over both."""

import os
import subprocess
from collections.abc import Iterator

import pytest

from parcel_hpc.testing.fakeslurm import FakeSlurm


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Iterator[FakeSlurm]:
    """A fake SLURM cluster of this test's own (3 nodes x 4 GPUs, partitions low and high, as the dev
    cluster): its sbatch, squeue, sacct, scancel, scontrol first on PATH and its SLURM_CONF, for this
    process and every process it starts. Whatever is still queued is cancelled afterwards."""
    fake = FakeSlurm.create(tmp_path / "fake-slurm")
    for name, value in fake.env().items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    yield fake
    subprocess.run(["scancel", *[j.job_id for j in fake.store.active()]], check=False, env=fake.env())
    fake.wait_idle(timeout=60)


@pytest.fixture
def cluster(request) -> FakeSlurm | None:
    """Parametrise a test with ``cluster``: "fake" runs it on ``fake_slurm`` (the fast tier), "real"
    on the dev cluster SLURM_CONF names (mark that param ``slurm``). See ``ON_BOTH``."""
    if request.param == "fake":
        return request.getfixturevalue("fake_slurm")
    assert request.param == "real", request.param
    return None


# A test that runs on the fake cluster and, slurm-marked, on the real one.
ON_BOTH = pytest.mark.parametrize("cluster", [pytest.param("fake", marks=pytest.mark.fake), pytest.param("real", marks=pytest.mark.slurm)], indirect=True)

# A search-level test whose SLURM behaviour (requeue, node down, kill, hold, preemption) test_slurm_behaviour.py
# holds the fake to on both clusters: it runs on the fake alone, the real cluster keeping the tests that
# need a real slurmctld (preemption with exact resume, daemon faults, accounting, the core on newer Slurm).
ON_FAKE = pytest.mark.parametrize("cluster", [pytest.param("fake", marks=pytest.mark.fake)], indirect=True)
