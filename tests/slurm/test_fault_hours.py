"""Numbers an admin can trust after faults (issue 44), on the real dev cluster: after a node set
DOWN mid-trial, a pack preempted and requeued, a drained node, an array task cancelled from outside
and a slurmdbd restart while jobs end, every command's GPU- and CPU-hours are sacct's (``sacct -D``,
every run) once sacct filed the runs, and reconcile's flags are exactly the differences that remain.

One following search and one detached search share the faults (the cluster's time is the test's):
the following launch records the scheduler's figures itself; the detached one is provisional until
``sync`` records them, and reconcile says what differs until then."""

import csv
import io
import json
import shutil
import time
from dataclasses import dataclass

import pytest

from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.testing import finish, parcel_hpc, start_launch

from .cluster import PREEMPTOR, kill_daemon, preempt, restart_daemons, sh, wait_for, what_the_cluster_says

pytestmark = pytest.mark.slurm

COMMON = ["hydra/launcher=submitit_slurm", "pruner=none", "checkpoint.every_steps=10", "train.steps=48", "train.step_seconds=0.25"]
ROUNDING = 1e-5  # the JSON's micro-hours, summed over a few dozen rows


def sacct_hours(search: SearchDir) -> tuple[float, float]:
    """(GPU-hours, CPU-hours) of every run of the search's jobs, as sacct -D counts them."""
    jobs = sorted({j for r in search.records() for j in r.jobs})
    rows = sh("sacct", "-X", "-n", "-P", "--duplicates", f"--jobs={','.join(jobs)}", "-o", "JobID,ElapsedRaw,AllocTRES").splitlines()
    gpu = cpu = 0.0
    for row in rows:
        _, elapsed, tres = row.split("|")
        alloc = dict(t.split("=", 1) for t in tres.split(",") if "=" in t)
        gpu += int(alloc.get("gres/gpu", 0)) * int(elapsed) / 3600
        cpu += int(alloc.get("cpu", 0)) * int(elapsed) / 3600
    return gpu, cpu


def running_on(search: SearchDir, min_step: int = 3) -> dict[str, str]:
    """node -> job id of every trial running past ``min_step``."""
    out = {}
    if not search.path.exists():
        return out
    for tid in search.trial_ids():
        if not (search.trial_dir(tid) / "spec.json").exists():
            continue
        r = search.record(tid)
        started = [e.data for e in search.events(tid) if e.kind.value == "started"]
        if r.state is TrialState.RUNNING and r.step >= min_step and started:
            out[started[-1].node] = started[-1].job_id
    return out


def requeued_and_training(search: SearchDir, job: str) -> bool:
    """A trial of ``job`` has trained for 5 s in a run after the job's first (a requeue)."""
    for tid in search.trial_ids():
        r = search.record(tid)
        last = r.attempts[-1] if r.attempts else None
        if last is not None and last.job_id == job and last.restart_count > 0 and last.how is None and time.time() - (last.started or 0) > 5:
            return True
    return False


def json_of(args: list[str], codes=(0,)) -> dict:
    res = parcel_hpc(args, timeout=300)
    assert res.returncode in codes, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout)


def every_command(search: SearchDir) -> tuple[dict, dict]:
    """status, list, export and reconcile print sacct's hours, all the same; reconcile's JSON, and
    list's (every search under the root)."""
    gpu, cpu = sacct_hours(search)
    status = json_of(["status", str(search.path), "--json"])["spend"]
    assert status["gpu_hours"] == pytest.approx(gpu, abs=ROUNDING) and status["cpu_hours"] == pytest.approx(cpu, abs=ROUNDING), (status, gpu, cpu)
    assert status["provisional"]["gpu_hours"] == 0 and status["provisional"]["cpu_hours"] == 0 and status["stale_holds"] == 0
    listed = {s["path"]: s for s in json_of(["list", str(search.path.parent), "--json"])["searches"]}
    assert listed[str(search.path)]["spend"] == status
    rows = list(csv.DictReader(io.StringIO(parcel_hpc(["export", str(search.path)]).stdout)))
    assert sum(float(r["gpu_hours"]) for r in rows) == pytest.approx(status["parts"]["attempts"]["gpu_hours"], abs=ROUNDING)
    assert sum(float(r["cpu_hours"]) for r in rows) == pytest.approx(status["parts"]["attempts"]["cpu_hours"], abs=ROUNDING)
    assert {float(r["provisional_gpu_hours"]) for r in rows} == {0.0}
    rec = json_of(["reconcile", str(search.path), "--json", "--wait", "120"])["campaigns"][0]
    assert rec["complete"] and rec["unrecorded"] == [] and rec["spend"] == status
    assert rec["scheduler"]["gpu_hours"]["used"] == pytest.approx(gpu, abs=1e-9)
    return rec, listed


def test_every_commands_hours_are_sacct_s_after_a_node_failure_preemption_drain_scancel_and_slurmdbd_restart(tmp_path, data_dir, cluster_guard):
    touched, names = cluster_guard
    names += ["parcel-hours", PREEMPTOR]
    root = tmp_path / "runs"
    # Detached: one trial pinned to n3 (a GPU of its four). Following: three packs of two trials, three
    # GPUs each, so one runs on each node.
    detached = start_launch(
        [
            *COMMON,
            f"search.root={root}",
            "search.revision=hours-detached",
            "search.n_trials=1",
            "search.wait=false",
            "+hydra.launcher.additional_parameters.nodelist=n3",
        ],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    following = start_launch(
        [
            *COMMON,
            f"search.root={root}",
            "search.revision=hours",
            "search.n_trials=6",
            "resources.gpus=3",
            "hydra.launcher.pack_size=2",
            "hydra.launcher.array_parallelism=3",
        ],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    try:
        launched = _faults(root, detached, following, touched)
    finally:
        if following.poll() is None:  # a failure above: the launch this test started goes with it
            following.kill()
            following.communicate()
    a, b = SearchDir(root / "hours"), SearchDir(root / "hours-detached")
    jobs = launched.jobs
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-2000:]
    assert {r.state for r in a.records()} == {TrialState.COMPLETED} and {r.state for r in b.records()} == {TrialState.COMPLETED}

    # The following launch recorded the scheduler's figures itself: every command agrees with sacct.
    assert every_command(a)[0]["flags"] == []

    # The detached search: its lost attempt counts until its next attempt noticed the loss, provisionally.
    (lost,) = [x for x in b.record("t0000").attempts if x.how is not None and x.how.value == "lost"]
    status = json_of(["status", str(b.path), "--json"])
    assert status["spend"]["provisional"]["gpu_hours"] > 0 and "provisional" in status["spend_line"]
    assert status["spend"]["gpu_hours"] > sacct_hours(b)[0] + 1e-4, (status["spend"], sacct_hours(b))  # charged until noticed
    before = json_of(["reconcile", str(b.path), "--json", "--wait", "120"])["campaigns"][0]
    assert before["spend"]["gpu_hours"] == pytest.approx(sacct_hours(b)[0], abs=ROUNDING) and len(before["unrecorded"]) >= 2
    assert [(f["kind"], f["trial_id"]) for f in before["flags"]] == [("stale_hold", "t0000")], before["flags"]
    assert f"attempt {lost.number} is charged" in before["flags"][0]["detail"] and "restates it" in before["flags"][0]["detail"]
    synced = parcel_hpc(["sync", str(b.path)])
    assert synced.returncode == 0 and "restated the budget charge" in synced.stdout, synced.stdout + synced.stderr
    rec, listed = every_command(b)
    assert rec["flags"] == []

    # One "charged to the caps" figure for each search, in list and in reconcile --root (their tables
    # print it through the one Spend.charged_line: tests/test_scheduler_hours.py).
    over = {s["path"]: s["spend"]["charged"] for s in json_of(["reconcile", "--root", str(root), "--json"])["searches"]}
    assert {path: s["spend"]["charged"] for path, s in listed.items()} == over and set(over) == {str(a.path), str(b.path)}

    # A difference planted in a copy: a run whose recorded end the scheduler contradicts is flagged.
    copy = SearchDir(tmp_path / "copy" / "hours")
    shutil.copytree(a.path, copy.path, symlinks=True)
    job = jobs["n2"]  # the drained node's pack: both its trials said how they ended, so only the run's hours move
    for journal in copy.trials_dir.glob("*/journal-*.jsonl"):
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        for e in lines:
            if e["kind"] == "accounted" and e["job_id"] == job:
                e["end"] += 30
                e["elapsed_s"] += 30
        journal.write_text("".join(json.dumps(e) + "\n" for e in lines))
    planted = json_of(["reconcile", str(copy.path), "--json"])["campaigns"][0]
    assert [(f["kind"], f["job_id"]) for f in planted["flags"]] == [("hours_mismatch", job)], planted["flags"]
    assert "sacct says" in planted["flags"][0]["detail"]


@dataclass
class Launched:
    returncode: int
    stdout: str
    stderr: str
    jobs: dict[str, str]  # node -> the following search's array task that ran there first


def _faults(root, detached, following, touched) -> Launched:
    """The faults, in order, while both searches run; the following launch's result."""
    assert finish(detached, timeout=120).returncode == 0
    a, b = SearchDir(root / "hours"), SearchDir(root / "hours-detached")
    jobs = wait_for(lambda: (lambda m: m if len(m) == 3 else None)(running_on(a)), 180, "a pack running on each node")
    wait_for(lambda: running_on(b).get("n3"), 120, "the detached trial running on n3")
    touched += ["n1", "n2", "n3"]
    sh("scontrol", "update", "nodename=n3", "state=down", "reason=parcel-test")  # node failure under both searches
    preempt("n1")  # the pack on n1 is preempted and requeued
    sh("scontrol", "update", "nodename=n2", "state=drain", "reason=parcel-test")  # its pack runs on; nothing new starts there
    gone = lambda: not set(sh("squeue", "-h", "-t", "RUNNING", "-o", "%i").split()) & {jobs["n1"], jobs["n3"]}  # noqa: E731
    wait_for(gone, 60, "the failed and the preempted packs to stop running")
    sh("scontrol", "update", "nodename=n3", "state=resume")
    # The pack the node failure requeued runs again: an admin cancels that array task from outside,
    # while accounting is down (slurmctld files its end once slurmdbd is back).
    wait_for(lambda: requeued_and_training(a, jobs["n3"]), 240, "the requeued pack to run again")
    kill_daemon("slurmdbd")
    try:
        sh("scancel", jobs["n3"])
        wait_for(lambda: jobs["n3"] not in sh("squeue", "-h", "-r", "-o", "%i").split(), 60, "the cancelled task to leave the queue")
    finally:
        sh("scontrol", "update", "nodename=n2", "state=resume")  # (the cluster's start waits for every node to answer)
        restart_daemons()
    try:
        launched = finish(following, timeout=600)
        wait_for(lambda: all(b.record(t).state.is_finished() for t in b.trial_ids()), 240, "the detached trial to finish")
    except Exception as exc:
        raise AssertionError(f"{exc}\n{what_the_cluster_says('parcel-hours')}") from None
    return Launched(launched.returncode, launched.stdout, launched.stderr, jobs)
