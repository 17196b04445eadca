"""SLURM unreachable: one line naming the problem, exit 2, nothing dispatched, nothing recorded."""

import os
import shutil

import pytest

from parcel_hpc.testing import launch


def slurm_launch(tmp_path, data_dir, env):
    return launch(["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.n_trials=2"], cwd=tmp_path, data_dir=data_dir, env=env)


def assert_refused_cleanly(res, tmp_path, needle):
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs the SLURM client (slurm-client) installed")
def test_no_slurm_conf(tmp_path, data_dir):
    if os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this machine has a system-wide /etc/slurm/slurm.conf")
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.n_trials=2"], cwd=tmp_path, data_dir=data_dir, env={"SLURM_CONF": ""}
    )
    assert_refused_cleanly(res, tmp_path, "SLURM is not configured")


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="needs the SLURM client (slurm-client) installed")
def test_slurmctld_down(tmp_path, data_dir):
    # A config whose controller port nobody listens on: what a client sees when slurmctld is down.
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=ghost\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\nAuthType=auth/none\n"
        "NodeName=g1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=g1 Default=YES\n"
    )
    res = slurm_launch(tmp_path, data_dir, {"SLURM_CONF": str(conf)})
    assert_refused_cleanly(res, tmp_path, "slurmctld")


def test_no_slurm_client_at_all(tmp_path, data_dir):
    res = slurm_launch(tmp_path, data_dir, {"PATH": os.path.dirname(os.sys.executable) + ":/nonexistent"})
    assert_refused_cleanly(res, tmp_path, "sbatch")
