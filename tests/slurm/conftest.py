"""Slurm-marked tests run against the real dev cluster (scripts/dev-cluster-up.sh).

Without a reachable cluster they skip, except under scripts/test.sh (PARCEL_REQUIRE_SLURM=1),
where a missing cluster is a failure: CI must never pass by skipping them.
"""

import os
import subprocess

import pytest

from .cluster import sh


def _reachable() -> str:
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set"
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    return "" if "UP" in out.stdout else f"slurmctld is not up: {out.stdout.strip() or out.stderr.strip()}"


def pytest_collection_modifyitems(config, items):
    problem = _reachable()
    if not problem:
        return
    for item in items:
        if item.get_closest_marker("slurm"):  # the marker, not the keyword: every test here has tests/slurm's name
            if os.environ.get("PARCEL_REQUIRE_SLURM") == "1":
                item.fixturenames.insert(0, "_fail_without_cluster")
            else:
                item.add_marker(pytest.mark.skip(reason=f"no SLURM cluster: {problem}; run scripts/dev-cluster-up.sh and source its env.sh"))


@pytest.fixture
def _fail_without_cluster():
    pytest.fail(f"the dev SLURM cluster is required here: {_reachable()}")


@pytest.fixture
def cluster_guard(request):
    """Whatever a test does to nodes, they are resumed and its stray jobs cancelled afterwards.
    ``names`` holds job-name prefixes: a search's jobs are named <job_name>-<search id>. A test on
    the fake cluster (``cluster``) has it set up first: the guard then cleans the fake, never the real one."""
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster")
    touched: list[str] = []
    names: list[str] = []
    yield touched, names
    for node in touched:
        sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    if names:
        queued = [line.split("|", 1) for line in sh("squeue", "-h", "-o", "%A|%j", check=False).splitlines() if "|" in line]
        stray = sorted({job for job, name in queued if name.startswith(tuple(names))})
        if stray:
            sh("scancel", *stray, check=False)
