"""Governed searches on the real dev SLURM cluster: array dispatch with GPU limits, preemption,
time limits, a node going down followed by resubmit, and a job killed for good.

Every scenario drives the real entry points (the launch, parcel-hpc status/resubmit) and the
real scheduler (sbatch of a competing job, scontrol on nodes, scancel)."""

import json
import re

import pytest
from clusters import ON_BOTH, ON_FAKE

from parcel_hpc.ledger.store import SearchDir
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import PREEMPTOR, preempt, sh, wait_for, what_the_cluster_says

SLURM = "hydra/launcher=submitit_slurm"


def slurm_launch(tmp_path, data_dir, rev, *overrides, timeout=600):
    return launch([SLURM, f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir, timeout=timeout)


def record(tmp_path, rev, tid="t0000"):
    return SearchDir(tmp_path / "runs" / rev).record(tid)


def events(tmp_path, rev, tid="t0000"):
    return [e.to_json() for e in SearchDir(tmp_path / "runs" / rev).events(tid)]


def reference_metric(tmp_path, data_dir, rev):
    """The same trial, uninterrupted, on the local executor."""
    res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}-ref", "search.n_trials=1", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    return record(tmp_path, f"{rev}-ref").metric


def running_at(tmp_path, rev, min_step):
    """The trial's job id and node once it has saved a checkpoint at or past ``min_step``."""

    def check():
        ck = sorted((tmp_path / "runs" / rev / "checkpoints" / "t0000").glob("ckpt-*.h5"))
        evs = [e for e in events(tmp_path, rev) if e["kind"] == "started"]
        if ck and int(ck[-1].stem.split("-")[1]) >= min_step and evs:
            return evs[-1]["job_id"], evs[-1]["node"]
        return None

    return wait_for(check, 120, f"a checkpoint at step >= {min_step}")


def wait_finished(tmp_path, rev, timeout):
    return wait_for(lambda: record(tmp_path, rev).state.is_finished() and record(tmp_path, rev), timeout, "the trial to finish")


@pytest.mark.slurm
def test_82_trial_array_search_with_gpu_limits(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-arr82")
    res = slurm_launch(tmp_path, data_dir, "arr82", "hydra.launcher.array_parallelism=12", "resources.gpus=1")
    assert res.returncode == 0, res.stderr[-2000:]
    # auto packing on a fresh search: the 10-minute limit is the expected length, 6 trials a task
    assert "packing: up to 6 trials a job, in turn, 14 jobs for 82 trials" in res.stdout, res.stdout[-3000:]
    st = json.loads(parcel_hpc(["status", str(tmp_path / "runs" / "arr82"), "--json"]).stdout)
    assert sum(st["counts"].values()) == 82
    assert st["counts"]["completed"] + st["counts"]["pruned"] == 82, st["counts"]
    sd = SearchDir(tmp_path / "runs" / "arr82")
    array_ids = set()
    for tid in sd.trial_ids():
        evs = [e.to_json() for e in sd.events(tid)]
        submitted = [e for e in evs if e["kind"] == "submitted"]
        started = [e for e in evs if e["kind"] == "started"]
        assert submitted and started
        assert submitted[0]["t"] < started[0]["t"]  # the job id was in the ledger before the trial started
        assert started[0]["cuda_visible_devices"] in {"0", "1", "2", "3"}  # SLURM bound one GPU
        assert started[0]["job_id"] == submitted[0]["job_id"]
        array_ids.add(submitted[0]["job_id"].split("_")[0])
    assert len(array_ids) == 1  # one array job
    array = array_ids.pop()
    tasks = {e.data.job_id for tid in sd.trial_ids() for e in sd.events(tid) if e.kind.value == "submitted"}
    assert len(tasks) == 14
    # slurmdbd writes a finished job's full record (AllocTRES included) a moment after it ends
    rows = wait_for(
        lambda: (lambda r: r if r.count("gres/gpu=1") == 14 else None)(
            sh("sacct", "-j", array, "--parsable2", "--noheader", "-X", "--format=JobID,State,AllocTRES")
        ),
        60,
        "sacct's final rows",
    )
    assert rows.count("COMPLETED") == 14
    # Every task's hours go to its trials and its own start-up, to the second of sacct's.
    out = wait_for(lambda: (lambda r: r if r["complete"] else None)(reconcile_json(tmp_path, "arr82")), 120, "a complete reconciliation")
    assert out["flags"] == [], out["flags"]
    assert sum(1 for a in out["attempts"] if a["trial_id"]) == 82 and sum(1 for a in out["attempts"] if not a["trial_id"]) == 14
    elapsed = {
        line.split("|")[0]: int(line.split("|")[1]) for line in sh("sacct", "-j", array, "--parsable2", "--noheader", "-X", "--format=JobID,ElapsedRaw").split()
    }
    assert sum(a["elapsed_s"] for a in out["attempts"]) == sum(elapsed.values())


def reconcile_json(tmp_path, rev):
    res = parcel_hpc(["reconcile", str(tmp_path / "runs" / rev), "--json"])
    assert res.returncode in (0, 4), res.stderr
    return json.loads(res.stdout)["campaigns"][0]


@pytest.mark.slurm
def test_a_preempted_pack_requeues_without_losing_or_rerunning_a_trial(tmp_path, data_dir, cluster_guard):
    """Three trials in one array task; the second is preempted mid-way: the first (finished) is not
    run again, the second resumes from its checkpoint, the third (not started) runs once."""
    _, names = cluster_guard
    names += ["parcel-packpre", PREEMPTOR]
    res = slurm_launch(
        tmp_path,
        data_dir,
        "packpre",
        "search.n_trials=3",
        "pruner=none",
        "search.wait=false",
        "resources.gpus=4",
        "train.step_seconds=0.15",
        "hydra.launcher.pack_size=3",
    )
    assert res.returncode == 0, res.stderr
    sd = SearchDir(tmp_path / "runs" / "packpre")

    def second_running():
        ck = sorted((sd.path / "checkpoints" / "t0001").glob("ckpt-*.h5"))
        started = [e for e in sd.events("t0001") if e.kind.value == "started"]
        return started[-1].data.node if ck and int(ck[-1].stem.split("-")[1]) >= 10 and started else None

    node = wait_for(second_running, 180, "the pack's second trial to checkpoint")
    preempt(node)
    try:
        wait_for(lambda: all(sd.record(t).state.is_finished() for t in sd.trial_ids()), 300, "every trial to finish")
    except AssertionError as exc:
        ledger = {t: [f"{e.kind.value}@{e.data.job_id if hasattr(e.data, 'job_id') else ''}" for e in sd.events(t)] for t in sd.trial_ids()}
        logs = "".join(f.read_text()[-3000:] for f in sorted((sd.path / "submitit").rglob("*_log.err")))
        raise AssertionError(f"{exc}\nledger: {ledger}\n{what_the_cluster_says('parcel-packpre')}\nworker log tail:\n{logs}") from None
    first, second, third = (sd.record(t) for t in ("t0000", "t0001", "t0002"))
    assert [r.state.value for r in (first, second, third)] == ["completed"] * 3
    assert len(first.attempts) == 1 and len(third.attempts) == 1  # neither lost nor run twice
    assert [a.how.value for a in second.attempts] == ["interrupted", "completed"] and second.attempts[0].cause.value == "preempted"
    assert second.attempts[1].resumed_from >= 10 and second.attempts[1].restart_count == 1
    assert len({a.job_id for r in (first, second, third) for a in r.attempts}) == 1  # one array task throughout
    assert third.attempts[0].restart_count == 1  # it started only in the requeued run
    out = wait_for(
        lambda: (lambda r: r if r["complete"] and not _flags_but_run_after_finish(r) else None)(reconcile_json(tmp_path, "packpre")),
        120,
        "a reconciliation without flags",
    )
    assert out["waste_hours"]["preemption"] > 0
    # The pack's own line per run; Slurm 24.11 runs the job once more after it completed: one flag.
    after = [f for f in out["flags"] if f["kind"] == "run_after_finish"]
    assert [a["run"] for a in out["attempts"] if not a["trial_id"]] == [0, 1, 2][: 2 + len(after)] and len(after) <= 1


def _flags_but_run_after_finish(reconciliation: dict) -> list[dict]:
    """The flags other than a run after finish (Slurm 24.11's run of a completed job, flagged once)."""
    return [f for f in reconciliation["flags"] if f["kind"] != "run_after_finish"]


@pytest.mark.slurm
def test_a_search_larger_than_max_array_size_is_split_into_arrays(tmp_path, data_dir, cluster_guard):
    """1,100 trials one a task: above the controller's MaxArraySize (1001 here), so two arrays, every
    job id recorded before release; cancelled at once (the split is what is tested)."""
    _, names = cluster_guard
    names.append("parcel-split")
    budget = ["budget.max_trials=1100", "budget.gpu_hours_cap=100000", "budget.cost_cap=1000000"]
    res = slurm_launch(
        tmp_path, data_dir, "split", "search.n_trials=1100", "search.wait=false", "resources.gpus=0", "hydra.launcher.pack_size=1", *budget, timeout=900
    )
    assert res.returncode == 0, res.stderr[-2000:]
    sd = SearchDir(tmp_path / "runs" / "split")
    cancel = parcel_hpc(["cancel", str(sd.path), "--reason", "split test", "--wait", "0"], timeout=600)
    assert cancel.returncode in (0, 4), cancel.stderr  # 4: jobs still ending (not waited for)
    jobs = [r.jobs for r in sd.records()]
    assert len(jobs) == 1100 and all(len(j) == 1 for j in jobs)
    arrays: dict[str, int] = {}
    for (job,) in jobs:
        array, _, task = job.partition("_")
        arrays[array] = arrays.get(array, 0) + 1
    assert sorted(arrays.values()) == [99, 1001], arrays
    launched = json.loads(sorted((sd.path / "launches").glob("*.json"))[-1].read_text())
    assert len(launched["jobs"]) == 1100


@ON_BOTH
def test_preempted_trial_resumes_to_the_uninterrupted_metric(cluster, tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-preempt", PREEMPTOR]
    res = slurm_launch(tmp_path, data_dir, "preempt", "search.n_trials=1", "pruner=none", "search.wait=false", "resources.gpus=4", "train.step_seconds=0.35")
    assert res.returncode == 0, res.stderr
    job, node = running_at(tmp_path, "preempt", 10)
    # A high-priority job wanting the same node's GPUs preempts the trial.
    preempt(node)
    rec = wait_finished(tmp_path, "preempt", 240)
    assert rec.state.value == "completed", (rec.state, rec.reason)
    first, last = rec.attempts[0], rec.attempts[-1]
    assert first.how.value == "interrupted" and first.cause == "preempted"  # not counted as a timeout
    assert last.resumed_from >= 10 and last.restart_count >= 1 and last.job_id == job
    assert rec.metric == reference_metric(tmp_path, data_dir, "preempt")

    # sacct --duplicates shows the requeued run and the final one; both match the ledger's attempts
    def reconciled():
        res = parcel_hpc(["reconcile", str(tmp_path / "runs" / "preempt"), "--json"])
        out = json.loads(res.stdout)["campaigns"][0] if res.returncode == 0 else None
        worked = [a for a in out["attempts"] if a["waste"] != "run_after_finish"] if out else []
        return out if out and not _flags_but_run_after_finish(out) and all(a["ledger_attempt"] for a in worked) else None

    out = wait_for(reconciled, 60, "a reconciliation without flags")
    runs = [(a["state"], a["ledger_attempt"], a["ledger_how"]) for a in out["attempts"] if a["waste"] != "run_after_finish"]
    # Slurm 24.11 files the run that completed PREEMPTED and runs the job once more: one flag, its hours no preemption's.
    after = [f for f in out["flags"] if f["kind"] == "run_after_finish"]
    last_state = "PREEMPTED" if after else "COMPLETED"
    assert runs[0][0] == "REQUEUED" and runs[0][1:] == (1, "interrupted") and runs[-1] == (last_state, len(rec.attempts), "completed") and len(after) <= 1
    assert out["waste_hours"]["preemption"] > 0


@pytest.mark.slurm
def test_time_limit_with_checkpoint_resumes(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-tlimit")
    res = slurm_launch(
        tmp_path,
        data_dir,
        "tlimit",
        "search.n_trials=1",
        "pruner=none",
        "search.wait=false",
        "resources.time_limit_min=1",
        "hydra.launcher.signal_delay_s=30",
        "train.step_seconds=0.5",
        # Room for a loaded machine (CI failed this test once on 24.11, why unseen): there a worker's
        # start takes more of each minute, so 82 steps of 0.5 s may need more attempts.
        "budget.max_retries=6",
    )
    assert res.returncode == 0, res.stderr
    try:
        rec = wait_finished(tmp_path, "tlimit", 480)
        assert rec.state.value == "completed", (rec.state, rec.reason)
    except AssertionError as exc:  # once in CI: where the attempts and the jobs stood
        raise AssertionError(f"{exc}\nledger: {events(tmp_path, 'tlimit')}\n{what_the_cluster_says('parcel-tlimit')}") from None
    assert rec.attempts[0].how.value == "interrupted" and rec.attempts[0].cause == "timeout"
    # Under load a requeued attempt may be signalled while it still imports, before it reads the
    # checkpoint; such an attempt did no work. Every attempt that did work went on from a checkpoint.
    evs = events(tmp_path, "tlimit")
    worked = {e["attempt"] for e in evs if e["kind"] == "milestone"}
    assert rec.resumed >= 1 and rec.attempts[-1].resumed_from > 0
    assert all(a.resumed_from > 0 for n, a in enumerate(rec.attempts[1:], 2) if n in worked), evs
    assert rec.metric == reference_metric(tmp_path, data_dir, "tlimit")


@ON_FAKE
def test_node_down_then_resubmit_excludes_the_node(cluster, tmp_path, data_dir, cluster_guard):
    touched, names = cluster_guard
    names.append("parcel-drain")
    res = slurm_launch(
        tmp_path,
        data_dir,
        "drain",
        "search.n_trials=1",
        "pruner=none",
        "search.wait=false",
        "resources.gpus=1",
        "train.step_seconds=0.35",
        "+hydra.launcher.additional_parameters.no_requeue=true",
    )
    assert res.returncode == 0, res.stderr
    job, node = running_at(tmp_path, "drain", 10)
    touched.append(node)
    sh("scontrol", "update", f"nodename={node}", "state=down", "reason=parcel-test")
    wait_for(lambda: job not in sh("squeue", "-h", "-r", "-o", "%i"), 60, "the job to leave the queue")
    search = str(tmp_path / "runs" / "drain")
    dry = parcel_hpc(["resubmit", search, "--dry-run"])
    assert dry.returncode == 0, dry.stderr
    assert "t0000" in dry.stdout and "node_fail" in dry.stdout and node in dry.stdout
    assert record(tmp_path, "drain").attempts[-1].how is None  # a dry run changes nothing
    res = parcel_hpc(["resubmit", search])
    assert res.returncode == 0, res.stderr
    rec = wait_finished(tmp_path, "drain", 240)
    assert rec.state.value == "completed", (rec.state, rec.reason)
    assert rec.attempts[0].cause == "node_fail" and len(rec.jobs) == 2
    new = [e for e in events(tmp_path, "drain") if e["kind"] == "submitted"][-1]
    assert new["exclude_nodes"] == [node]
    assert rec.attempts[-1].host and rec.attempts[-1].resumed_from >= 10
    started = [e for e in events(tmp_path, "drain") if e["kind"] == "started"]
    assert started[-1]["node"] != node
    again = parcel_hpc(["resubmit", search, "--dry-run"])
    assert "nothing" in again.stdout  # a completed trial is never resubmitted


@ON_FAKE
def test_job_killed_for_good_is_not_retried_forever(cluster, tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-killed")
    res = slurm_launch(
        tmp_path,
        data_dir,
        "killed",
        "search.n_trials=1",
        "pruner=none",
        "search.wait=false",
        "train.step_seconds=0.5",
        "budget.max_retries=1",
        "+hydra.launcher.additional_parameters.no_requeue=true",
    )
    assert res.returncode == 0, res.stderr
    search = str(tmp_path / "runs" / "killed")
    for round_ in range(2):
        job, _ = wait_for(
            lambda n=round_ + 1: (lambda e: e and (e[-1]["job_id"], e[-1]["node"]))(
                [e for e in events(tmp_path, "killed") if e["kind"] == "started" and e["attempt"] == n]
            ),
            120,
            "the attempt to start",
        )
        sh("scancel", job)
        wait_for(lambda job=job: job not in sh("squeue", "-h", "-r", "-o", "%i"), 60, "the job to leave the queue")
        res = parcel_hpc(["resubmit", search])
        assert res.returncode == 0, res.stderr
    rec = record(tmp_path, "killed")
    assert rec.state.value == "failed" and "max_retries" in rec.reason, (rec.state, rec.reason)
    assert [a.cause for a in rec.attempts] == ["cancelled", "cancelled"]
    last = parcel_hpc(["resubmit", search, "--dry-run"])
    assert "nothing" in last.stdout


@ON_BOTH
def test_dry_run_submits_nothing_and_shows_the_batch_script(cluster, tmp_path, data_dir):
    res = slurm_launch(tmp_path, data_dir, "dry", "search.n_trials=5", "search.dry_run=true", "resources.gpus=2")
    assert res.returncode == 0, res.stderr
    for line in ("#SBATCH --array=0-4%", "#SBATCH --gres=gpu:2", "#SBATCH --time=10", "#SBATCH --mem=1024M", "#SBATCH --job-name=parcel-dry"):
        assert line in res.stdout
    assert "worst case: 5.00 GPU-hours" in res.stdout  # 5 trials x (1 + 2 retries) x 2 GPUs x 10 min
    assert "parcel-dry" not in sh("squeue", "-h", "-o", "%j")
    assert not (tmp_path / "runs" / "dry").exists()
    # A learning sampler runs in slots (dispatch=auto): the script is the slots' array, at a slot's --time.
    res = slurm_launch(tmp_path, data_dir, "dry", "sampler=tpe", "search.n_trials=20", "search.dry_run=true", "hydra.launcher.array_parallelism=4")
    assert res.returncode == 0, res.stderr
    minutes = int(re.search(r"slots: up to 4 jobs of (\d+) min each running 20 trials", res.stdout).group(1))
    assert minutes >= 10 and f"#SBATCH --time={minutes}\n" in res.stdout and "#SBATCH --array=0-3%4" in res.stdout, res.stdout
    assert "# 4 slots: array tasks that each take trials in turn" in res.stdout
    assert not (tmp_path / "runs" / "dry").exists()


@pytest.mark.slurm
def test_ctrl_c_stops_waiting_but_not_the_trials(tmp_path, data_dir, cluster_guard):
    import signal
    import subprocess
    import sys

    from parcel_hpc.testing.runs import subprocess_env

    _, names = cluster_guard
    names.append("parcel-ctrlc")
    argv = [
        sys.executable,
        "-m",
        "parcel_hpc.launch",
        "-m",
        SLURM,
        f"search.root={tmp_path / 'runs'}",
        "search.revision=ctrlc",
        "search.n_trials=3",
        "pruner=none",
        "train.step_seconds=0.1",
    ]
    proc = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    search = SearchDir(tmp_path / "runs" / "ctrlc")
    wait_for(
        lambda: search.path.exists() and len(search.trial_ids()) == 3 and all(search.record(t).jobs for t in search.trial_ids()),
        60,
        "the trials to be submitted",
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "keep running" in err
    st = json.loads(parcel_hpc(["status", str(search.path), "--json"]).stdout)
    assert all(t["state"] in ("queued", "running", "completed") for t in st["trials"])
    wait_for(lambda: all(search.record(t).state.value == "completed" for t in search.trial_ids()), 180, "the trials to complete")
