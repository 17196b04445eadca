"""Select once, then evaluate, on the dev SLURM cluster: the rerun and the final evaluation run as
batch jobs rendered from sbatch_templates/, the top candidate is held on crushed_corner, a decision
releases it, the final partition is evaluated once, and the packet carries sacct's accounting."""

import json

from clusters import ON_BOTH

from parcel_hpc.ledger import Executor, JobRole, SearchDir
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import sh, wait_for
from .examples import submitted_jobs


def accounted(name: str) -> list[str]:
    return sh("sacct", "--noheader", "--parsable2", "-X", f"--name={name}", "--starttime=now-1days", "--format=JobID,State").split()


@ON_BOTH
def test_select_decide_evaluate_release_as_slurm_jobs(cluster, tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-rel")  # its trial, rerun and final jobs: parcel-rel-<search id>, parcel-rel-rerun-<id>, ...
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=rel", "search.n_trials=12", "budget.max_trials=12"]
        + ["pruner=none", "hydra.launcher.array_parallelism=12"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr
    path = tmp_path / "runs" / "rel"
    sid = SearchDir(path).identity().short

    def cli(*args):
        return parcel_hpc([*args, str(path)] if args[0] != "decide" else [args[0], str(path), *args[1:]], cwd=tmp_path, timeout=600)

    sel = cli("select")
    assert sel.returncode == 3, sel.stdout + sel.stderr
    assert sel.stdout.splitlines()[0] == "hold:slice-quality"
    assert "damage_type=crushed_corner" in sel.stdout
    store = SelectionStore(SearchDir(path))
    record = store.record()
    (submitted,) = submitted_jobs(record, JobRole.RERUN)
    assert submitted.executor == Executor("slurm")
    rerun_job = submitted.job_id
    script = (store.log_dir(1) / "winner_rerun.sbatch").read_text()
    assert "#SBATCH --gres=gpu:1" in script and f"#SBATCH --job-name=parcel-rel-rerun-{sid}\n" in script
    assert f"selection-job {path} rerun --selection 1" in script
    # sacct knows the rerun as a job of its own name (by name: a restarted dev cluster reuses job
    # ids), once slurmdbd has caught up.
    wait_for(lambda: f"{rerun_job}|COMPLETED" in accounted(f"parcel-rel-rerun-{sid}"), 60, "sacct to record the rerun job")

    ok = cli("decide", "--accept", "--by", "Dana Reviewer", "--reason", "crushed_corner loss accepted for the pilot")
    assert ok.returncode == 0 and ok.stdout.splitlines()[0] == "evaluate:final-holdout", ok.stdout + ok.stderr
    final = cli("evaluate-final")
    assert final.returncode == 0, final.stdout + final.stderr
    (final_submitted,) = submitted_jobs(store.record(), JobRole.FINAL)
    final_job = final_submitted.job_id
    # The final job itself logged its one read of the final partition, under its own job id.
    assert [(o.job_id, o.restart_count) for _, o in store.record().final_opened] == [(final_job, 0)]
    wait_for(lambda: f"{final_job}|COMPLETED" in accounted(f"parcel-rel-final-{sid}"), 60, "sacct to record the final job")
    second = cli("evaluate-final")
    assert second.returncode == 3 and second.stdout.splitlines()[0] == "reject:final-holdout-used"

    rel = cli("release")
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    packet = json.loads((path / "release" / "packet.json").read_text())
    assert packet["compute"]["sacct"] is not None, packet["compute"]["sacct_note"]
    assert packet["compute"]["sacct"]["scheduler"]["gpu_hours"]["used"] > 0
    assert packet["lineage"]["how_it_ended"]["jobs"] and packet["final"]["final_examples"] > 0
    assert packet["checks"] == {
        "data": "passed",
        "reproducible": "passed",
        "performance": "passed",
        "parity": "passed",
        "slices": "decided",
        "final": "passed",
        "final-performance": "passed",
    }
