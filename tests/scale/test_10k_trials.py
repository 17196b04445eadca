"""Scale, run apart (``-m scale``: about 10 minutes on two cores for the packed search, see
docs/performance.md): a 10,000-trial packed search on a 50-node dev cluster completes, and so does
a TPE search in 50 slots (``PARCEL_SCALE_TPE_TRIALS``, 1,000 by default: every proposal is told
every earlier trial, so its cost grows with the search); ``status`` and ``reconcile`` are exact for
both. The cluster is the project's own script with NODES=50 beside the 3-node one."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.testing import launch, parcel_hpc

pytestmark = pytest.mark.scale

REPO = Path(__file__).resolve().parents[2]
BASE = Path(os.environ.get("PARCEL_SCALE_BASE", "/tmp/parcel-slurm50"))
N = 10_000
N_TPE = int(os.environ.get("PARCEL_SCALE_TPE_TRIALS", "1000"))


@pytest.fixture(scope="module")
def cluster50() -> dict:
    knobs = {"NODES": "50", "PORT_BASE": "17817", "DB_PORT": "14306"}
    subprocess.run(["bash", str(REPO / "scripts" / "dev-cluster-up.sh"), str(BASE)], env={**os.environ, **knobs}, check=True, capture_output=True, timeout=600)
    env = {"SLURM_CONF": str(BASE / "etc" / "slurm.conf")}
    assert "MaxArraySize" in subprocess.run(["scontrol", "show", "config"], env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    return env


def test_10000_packed_trials_on_50_nodes_are_counted_exactly(tmp_path, data_dir, cluster50):
    overrides = ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=scale", f"search.n_trials={N}"]
    overrides += [f"budget.max_trials={N}", "budget.gpu_hours_cap=1000000", "budget.cost_cap=10000000", "pruner=none", "train.steps=10"]
    overrides += ["checkpoint.every_steps=10", "resources.gpus=1", "hydra.launcher.array_parallelism=50", "hydra.launcher.pack_size=50"]
    res = launch(overrides, cwd=tmp_path, data_dir=data_dir, env=cluster50, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "scale")
    records = list(search.records())
    assert len(records) == N and {r.state for r in records} == {TrialState.COMPLETED}
    assert all(len(r.attempts) == 1 for r in records)
    tasks = {r.jobs[0] for r in records}
    assert len(tasks) == N // 50
    status = parcel_hpc(["status", str(search.path), "--json"], env=cluster50, timeout=1800)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["completed"] == N
    rec = parcel_hpc(["reconcile", str(search.path), "--json", "--wait", "300"], env=cluster50, timeout=2400)
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr
    out = json.loads(rec.stdout)["campaigns"][0]
    assert out["complete"] and out["flags"] == []
    assert sum(1 for a in out["attempts"] if a["trial_id"]) == N
    assert {a["job_id"] for a in out["attempts"]} == tasks


def test_a_tpe_search_in_50_slots_runs_every_trial_once_and_is_counted_exactly(tmp_path, data_dir, cluster50):
    overrides = ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=scale-tpe", f"search.n_trials={N_TPE}"]
    overrides += ["sampler=tpe", f"budget.max_trials={N_TPE}", "budget.gpu_hours_cap=1000000", "budget.cost_cap=10000000", "pruner=none"]
    overrides += ["train.steps=10", "checkpoint.every_steps=10", "resources.gpus=1", "hydra.launcher.array_parallelism=50"]
    res = launch(overrides, cwd=tmp_path, data_dir=data_dir, env=cluster50, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "scale-tpe")
    records = list(search.records())
    duplicates = search.launches()[-1]["duplicates"]
    assert len(records) + len(duplicates) == N_TPE and {r.state for r in records} == {TrialState.COMPLETED}
    assert all(len(r.attempts) == 1 for r in records) and search.proposal_numbers() == list(range(N_TPE))
    slots = {s["job_id"] for s in search.slot_records()}
    assert {r.jobs[0] for r in records} <= slots and len(slots) <= 2 * 50  # slots, not a job a trial
    status = parcel_hpc(["status", str(search.path), "--json"], env=cluster50, timeout=1800)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["completed"] == len(records)
    rec = parcel_hpc(["reconcile", str(search.path), "--json", "--wait", "300"], env=cluster50, timeout=2400)
    assert rec.returncode == 0, rec.stdout[-2000:] + rec.stderr
    out = json.loads(rec.stdout)["campaigns"][0]
    assert out["complete"] and out["flags"] == []
    assert sum(1 for a in out["attempts"] if a["trial_id"]) == len(records)
    replay = parcel_hpc(["proposals", str(search.path), "--replay", "--json"], timeout=3600)
    assert replay.returncode == 0 and replay.json()["replayed"] == N_TPE, replay.stdout[-2000:]
