"""parcel-hpc reconcile against the real cluster's sacct: every attempt, orphans, the budget hold."""

import json

import pytest

from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.testing import faults, launch, parcel_hpc
from parcel_hpc.worker.training import STEP_HOOK_ENV

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm


def reconcile_json(path) -> dict:
    res = parcel_hpc(["reconcile", str(path), "--json"])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["campaigns"][0]


def test_failed_jobs_and_an_orphan_reconcile_with_sacct(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-acct")
    res = launch(
        [
            "hydra/launcher=submitit_slurm",
            f"search.root={tmp_path / 'runs'}",
            "search.revision=acct",
            "search.n_trials=4",
            "pruner=none",
            "+space.params.fault={type:choice,values:[none,raise]}",
            faults.TRAINER,
        ],
        cwd=tmp_path,
        data_dir=data_dir,
        env={STEP_HOOK_ENV: faults.HOOK},
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "acct")
    states = {r.trial_id: r.state.value for r in search.records()}
    assert set(states.values()) == {"completed", "failed"}, states  # the space draws both
    (name,) = search.job_names(Executor("slurm"))
    assert name == f"parcel-acct-{search.identity().short}"
    orphan = sh("sbatch", "--parsable", "-J", name, "-o", "/dev/null", "--mem=50M", "-t", "1", "--wrap", "true").strip()
    wait_for(
        lambda: (
            "COMPLETED" in sh("sacct", "-j", orphan, "-X", "-n", "-o", "State,Partition") and "low" in sh("sacct", "-j", orphan, "-X", "-n", "-o", "Partition")
        ),
        60,
        "the orphan's accounting",
    )
    # sacct writes a job's full record a moment after it ends: wait until every job is final
    wait_for(
        lambda: all(l.split("|")[1] for l in sh("sacct", f"--name={name}", "-X", "-n", "-P", "-o", "JobID,Partition").splitlines()), 60, "final sacct rows"
    )
    out = reconcile_json(search.path)
    assert [(f["kind"], f["job_id"]) for f in out["flags"]] == [("orphan", orphan)]
    lines = [a for a in out["attempts"] if a["trial_id"]]
    ledger_attempts = sum(len(r.attempts) for r in search.records())
    assert len(lines) == ledger_attempts and all(a["ledger_attempt"] is not None for a in lines)
    for a in lines:
        assert a["end"] - a["start"] == a["elapsed_s"]  # the scheduler's own seconds, not the ledger's estimate
        assert a["gpu_hours"] == pytest.approx(a["gpus"] * a["elapsed_s"] / 3600)
        assert (a["state"] == "FAILED") == (states[a["trial_id"]] == "failed")
    failed = [t for t in out["trials"] if t["state"] == "failed"]
    assert all(t["attempts"] == 2 for t in failed)  # tried twice, never a third time
    assert out["waste_hours"]["reproducible_failure"] == pytest.approx(sum(t["gpu_hours"] for t in failed))
    assert out["figures"]["effective_results"] == len(states)  # completed and reproducibly failed both count
    assert out["scheduler"]["gpu_hours"]["used"] == pytest.approx(
        sum(a["gpu_hours"] for a in lines) + sum(a["gpu_hours"] for a in out["attempts"] if not a["trial_id"])
    )


def test_launch_over_the_cap_is_refused_before_any_submission(tmp_path, data_dir):
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=overcap", "search.n_trials=30", "budget.gpu_hours_cap=2"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "hold:budget"
    assert "over by" in res.stderr
    assert "parcel-overcap" not in sh("squeue", "-h", "-o", "%j")
    assert sh("sacct", "--name=parcel-overcap", "-n", "-X", "-S", "now-1hour", "-o", "JobID").strip() == ""
    assert not (tmp_path / "runs" / "overcap" / "contract.json").exists()  # a held first launch freezes nothing
