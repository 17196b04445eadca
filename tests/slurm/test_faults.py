"""The fault matrix: each test is named after the fault it survives, and ends with every trial in
exactly one state and reports that match sacct. Daemon faults run on the real dev cluster, a drain
on both; a requeue and a stale hold on the fake SLURM alone (``ON_FAKE``: test_slurm_behaviour.py
holds its requeue and held jobs to the real cluster's).

Faults covered elsewhere (named in docs/faults-and-inputs.md): preemption, TIMEOUT with a checkpoint, a
node set DOWN, a job killed for good (tests/slurm/test_slurm_search.py); a shared checkpoint
prefix, SIGKILL mid-run, duplicates from two launchers (tests/test_faults_local.py)."""

import json
import signal
import time

import pytest
from clusters import ON_BOTH, ON_FAKE

from parcel_hpc.budget import BudgetLedger, KeyState
from parcel_hpc.ledger import AttemptEnd, Executor, SearchDir, TrialState
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch

from .cluster import kill_daemon, restart_daemons, sh, wait_for

SLURM = "hydra/launcher=submitit_slurm"
SLOW = ["pruner=none", "checkpoint.every_steps=10"]  # with train.step_seconds: trials long enough to hit


def start(tmp_path, data_dir, rev, *overrides):
    return start_launch([SLURM, f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *SLOW, *overrides], cwd=tmp_path, data_dir=data_dir)


def each_in_one_state(search: SearchDir, state: TrialState = TrialState.COMPLETED) -> list:
    """Every trial ended in ``state`` (a fold gives each trial exactly one), none scored from a
    quarantined or partial attempt; the records, for more checks."""
    records = list(search.records())
    assert records and {r.state for r in records} == {state}, [(r.trial_id, r.state.value, r.reason) for r in records]
    for r in records:
        assert not r.invalid_metrics and (r.metric is not None) == (state is TrialState.COMPLETED)
    return records


def matches_sacct(search: SearchDir) -> dict:
    """reconcile, once complete: no flags, one line per ledger attempt, GPU-hours equal to sacct's
    as sacct reads just before and just after it. A slurmdbd back from a fault may still rewrite a
    record it filed (CI saw a job's hours grow by a second after reconcile read them): then the
    comparison is made again, on records that held still around one reconcile."""
    for _ in range(10):
        before = own_gpu_hours(search)
        out = reconcile_json(search.path)
        after = own_gpu_hours(search)
        if before == after:
            break
        time.sleep(1)
    assert before == after, f"sacct kept changing: {before} then {after} GPU-h"
    assert out["flags"] == [], out["flags"]
    lines = [a for a in out["attempts"] if a["trial_id"]]
    assert len(lines) == sum(len([a for a in r.attempts if a.started is not None]) for r in search.records())
    assert out["scheduler"]["gpu_hours"]["used"] == pytest.approx(after, abs=1e-9), out["attempts"]
    return out


def first_started(search: SearchDir, min_step: int = 0):
    """(job id, node) of t0000's attempt once it trained past ``min_step``."""

    def check():
        if not (search.trial_dir("t0000") / "spec.json").exists():  # the launch makes the folder, then the spec
            return None
        r = search.record("t0000")
        ev = [e for e in search.events("t0000") if e.kind.value == "started"]
        return (ev[-1].data.job_id, ev[-1].data.node) if ev and r.state is TrialState.RUNNING and r.step >= max(min_step, 1) else None

    return wait_for(check, 120, f"t0000 to train past step {min_step}")


def reconcile_json(path, wait_s: int = 120) -> dict:
    """reconcile once slurmdbd filed every job in full (exit 0: complete; 4 would be pending)."""
    res = parcel_hpc(["reconcile", str(path), "--json", "--wait", str(wait_s)], timeout=wait_s + 60)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    out = json.loads(res.stdout)["campaigns"][0]
    assert out["complete"] and out["pending"] == []
    return out


def own_gpu_hours(search: SearchDir) -> float:
    """GPU-hours of the search's own attempts, from sacct by job id (never by name)."""
    jobs = sorted({j for r in search.records() for j in r.jobs})
    rows = sh("sacct", "-X", "-n", "-P", "--duplicates", f"--jobs={','.join(jobs)}", "-o", "JobID,ElapsedRaw,AllocTRES").splitlines()
    total = 0.0
    for row in rows:
        _, elapsed, tres = row.split("|")
        gpus = next((int(t.split("=")[1]) for t in tres.split(",") if t.startswith("gres/gpu=")), 0)
        total += gpus * int(elapsed) / 3600
    return total


@pytest.mark.slurm
def test_same_revision_in_two_roots(tmp_path, data_dir, cluster_guard):
    """Two researchers keep the default revision name in their own roots, at the same time: neither
    search sees, counts or orphans the other's jobs."""
    _, names = cluster_guard
    names.append("parcel-twin")
    roots = [tmp_path / "alice", tmp_path / "bob"]
    procs = [
        start_launch(
            [SLURM, f"search.root={root}", "search.revision=twin", "search.n_trials=3", "pruner=none", "train.step_seconds=0.05"],
            cwd=tmp_path,
            data_dir=data_dir,
        )
        for root in roots
    ]
    results = [finish(p) for p in procs]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-400:] for r in results]
    searches = [SearchDir(root / "twin") for root in roots]
    ids = [s.identity() for s in searches]
    assert ids[0].search_id != ids[1].search_id and ids[0].contract_digest == ids[1].contract_digest  # configured alike
    jobs = [{j for r in s.records() for j in r.jobs} for s in searches]
    assert not jobs[0] & jobs[1]
    for search, own in zip(searches, jobs):
        (name,) = search.job_names(Executor("slurm"))
        assert name == f"parcel-twin-{search.identity().short}"
        out = matches_sacct(search)
        listed = {l.split("|")[0] for l in sh("sacct", "-X", "-n", "-P", f"--name={name}", "-S", "now-1hour", "-o", "JobID").splitlines()}
        assert listed == own  # the scheduler's name finds exactly this search's jobs
        assert sorted(a["job_id"] for a in out["attempts"]) == sorted(own)
        status = parcel_hpc(["status", str(search.path), "--json"])
        assert status.returncode == 0, status.stderr
        assert {t["trial_id"]: t["state"] for t in json.loads(status.stdout)["trials"]} == {r.trial_id: "completed" for r in search.records()}


@ON_FAKE
def test_scontrol_requeue(cluster, tmp_path, data_dir, cluster_guard):
    """An admin requeues a running trial's job: it resumes from its checkpoint, to the same metric,
    and the attempt the requeue ended (the worker is killed before it can say how: ``lost``,
    resolved by the next attempt) has its budget hold settled, not held for good."""
    _, names = cluster_guard
    names.append("parcel-requeue")
    search = SearchDir(tmp_path / "runs" / "requeue")
    proc = start(tmp_path, data_dir, "requeue", "search.n_trials=1", "train.step_seconds=0.25")
    job, _ = first_started(search, min_step=25)
    sh("scontrol", "requeue", job)
    assert finish(proc).returncode == 0
    (record,) = each_in_one_state(search)
    assert len(record.attempts) == 2 and record.attempts[1].resumed_from >= 20, record.attempts
    assert record.attempts[0].how is AttemptEnd.LOST, record.attempts[0]  # killed by the requeue: resolved by attempt 2
    reference = launch([f"search.root={tmp_path / 'ref'}", "search.revision=requeue", "search.n_trials=1", *SLOW], cwd=tmp_path, data_dir=data_dir)
    assert reference.returncode == 0
    assert record.metric == SearchDir(tmp_path / "ref" / "requeue").record("t0000").metric  # resumed, not restarted
    out = matches_sacct(search)  # no flags: no stale_hold either
    view = BudgetLedger.read(search.path)
    assert view.totals.reserved_gpu_hours == 0 and {h.state for h in view.holds.values()} == {KeyState.SETTLED}, view
    spend = one_spend(search, out)
    assert spend["parts"]["held"]["gpu_hours"] == 0 and spend["stale_holds"] == 0
    assert spend["parts"]["attempts"]["gpu_hours"] == pytest.approx(view.totals.used_gpu_hours, abs=1e-6)


@ON_FAKE
def test_a_stale_hold_is_flagged_by_reconcile_and_settled_by_sync(cluster, tmp_path, data_dir, cluster_guard):
    """A hold an older parcel_hpc left on a ``lost`` attempt (its settle entry missing): reconcile
    flags it and names the fix, and ``sync`` settles it with the hours the ledger saw."""
    _, names = cluster_guard
    names.append("parcel-stale")
    search = SearchDir(tmp_path / "runs" / "stale")
    assert finish(start(tmp_path, data_dir, "stale", "search.n_trials=1")).returncode == 0
    settled = one_spend(search, matches_sacct(search))
    journal = search.path / "budget" / "journal"
    last = sorted(journal.glob("*.json"))[-1]
    assert json.loads(last.read_text())["kind"] == "settle"
    last.unlink()
    out = reconcile_json(search.path)
    (flag,) = [f for f in out["flags"] if f["kind"] == "stale_hold"]
    assert flag["trial_id"] == "t0000" and "attempt 1 ended" in flag["detail"] and f"`parcel-hpc sync {search.path}`" in flag["detail"]
    assert one_spend(search, out)["stale_holds"] == 1
    synced = parcel_hpc(["sync", str(search.path)])
    assert synced.returncode == 0 and "t0000/1: settled the budget hold" in synced.stdout, synced.stdout + synced.stderr
    assert BudgetLedger.read_totals(search.path).reserved_gpu_hours == 0
    assert one_spend(search, matches_sacct(search)) == settled  # the same hours as the worker's own settle


def one_spend(search: SearchDir, reconciled: dict) -> dict:
    """The spend list, status and reconcile show: one figure, its parts adding up."""
    (listed,) = json.loads(parcel_hpc(["list", str(search.path.parent), "--json"]).stdout)["searches"]
    status = json.loads(parcel_hpc(["status", str(search.path), "--json"]).stdout)["spend"]
    assert listed["spend"] == status == reconciled["spend"], (listed["spend"], status, reconciled["spend"])
    assert status["gpu_hours"] == pytest.approx(sum(p["gpu_hours"] for p in status["parts"].values()), abs=1e-5)
    return status


@ON_BOTH
def test_node_drained_while_trials_pending(cluster, tmp_path, data_dir, cluster_guard):
    """Every node is drained before the trials start: they wait in the queue, never retried or
    counted as failures, and run once the nodes are back."""
    touched, names = cluster_guard
    names.append("parcel-drained")
    nodes = sorted(set(sh("sinfo", "-h", "-N", "-o", "%N").split()))
    touched.extend(nodes)
    sh("scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", "reason=parcel-test")
    res = launch(
        [SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=drained", "search.n_trials=3", "search.wait=false"], cwd=tmp_path, data_dir=data_dir
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "drained")
    (name,) = search.job_names(Executor("slurm"))
    wait_for(lambda: len(sh("squeue", "-h", f"--name={name}", "--array", "-t", "PENDING", "-o", "%i").split()) == 3, 30, "three pending jobs")
    dry = parcel_hpc(["resubmit", str(search.path), "--dry-run"])
    assert dry.returncode == 0 and "nothing" in dry.stdout, dry.stdout
    time.sleep(5)  # drained nodes hold them however long it takes
    assert {r.state for r in search.records()} == {TrialState.QUEUED}
    assert len(sh("squeue", "-h", f"--name={name}", "--array", "-t", "PENDING", "-o", "%i").split()) == 3
    sh("scontrol", "update", f"nodename={','.join(nodes)}", "state=resume")
    wait_for(lambda: all(r.state.is_finished() for r in search.records()), 180, "the trials to finish")
    records = each_in_one_state(search)
    assert all(len(r.attempts) == 1 for r in records)
    out = matches_sacct(search)
    assert min(w for t in out["trials"] for w in t["queue_wait_s"]) >= 5  # they really waited for the nodes


@pytest.mark.slurm
def test_slurmd_killed_mid_trial(tmp_path, data_dir, cluster_guard):
    """The node daemon dies under a running trial and comes back: the job lives on (slurmstepd
    runs it), the trial ends once, and accounting agrees."""
    _, names = cluster_guard
    names.append("parcel-slurmd")
    search = SearchDir(tmp_path / "runs" / "slurmd")
    proc = start(tmp_path, data_dir, "slurmd", "search.n_trials=1", "train.step_seconds=0.2")
    _, node = first_started(search, min_step=10)
    kill_daemon(f"slurmd-{node}")
    try:
        wait_for(lambda: search.record("t0000").step >= 30, 60, "training to go on without slurmd")
    finally:
        restart_daemons()
    assert finish(proc).returncode == 0
    each_in_one_state(search)
    matches_sacct(search)


@pytest.mark.slurm
def test_slurmctld_restarted_mid_search(tmp_path, data_dir, cluster_guard):
    """The controller goes away while a launch follows its trials: the launch waits for it instead
    of failing, and every trial ends once."""
    _, names = cluster_guard
    names.append("parcel-ctld")
    search = SearchDir(tmp_path / "runs" / "ctld")
    proc = start(tmp_path, data_dir, "ctld", "search.n_trials=3", "train.step_seconds=0.3", "hydra.launcher.array_parallelism=3")
    first_started(search, min_step=5)
    kill_daemon("slurmctld", signal.SIGTERM)
    down_at = time.monotonic()
    try:
        wait_for(lambda: search.record("t0000").step >= 40, 60, "training to go on without slurmctld")
        time.sleep(max(0.0, 25 - (time.monotonic() - down_at)))  # longer than squeue's own retries (about 9 s)
    finally:
        restart_daemons()
    launched = finish(proc)
    assert launched.returncode == 0, launched.stdout[-1500:] + launched.stderr[-1500:]
    assert "the scheduler is not answering" in launched.stdout and "answers again" in launched.stdout
    records = each_in_one_state(search)
    assert all(len(r.attempts) == 1 for r in records)
    matches_sacct(search)


@pytest.mark.slurm
def test_slurmdbd_down_during_reconcile(tmp_path, data_dir, cluster_guard):
    """Accounting is down: reconcile says so in one line and writes nothing; once it is back the
    report is complete."""
    _, names = cluster_guard
    names.append("parcel-dbd")
    res = launch([SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=dbd", "search.n_trials=2"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "dbd")
    before = sorted((str(p), p.stat().st_mtime_ns) for p in search.path.rglob("*"))
    kill_daemon("slurmdbd")
    try:
        down = parcel_hpc(["reconcile", str(search.path), "--json"], timeout=120)
    finally:
        restart_daemons()
    assert down.returncode == 2 and down.stdout == "", down.stdout + down.stderr
    assert len(down.stderr.splitlines()) == 1 and down.stderr.startswith("error: ") and "sacct" in down.stderr
    assert sorted((str(p), p.stat().st_mtime_ns) for p in search.path.rglob("*")) == before
    each_in_one_state(search)
    matches_sacct(search)


@pytest.mark.slurm
def test_500_short_trials_from_two_concurrent_launchers(tmp_path, data_dir, cluster_guard):
    """Load: two launchers start the same 500-trial search at once (packed, as by default). Every
    trial is owned, dispatched and run exactly once; the ledger stays whole and every count is exact."""
    _, names = cluster_guard
    names.append("parcel-load")
    budget = ["budget.max_trials=500", "budget.gpu_hours_cap=100000", "budget.cost_cap=1000000"]
    common = [SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=load", "search.n_trials=500", "pruner=none", "train.steps=10"]
    common += ["resources.gpus=1", "hydra.launcher.array_parallelism=12", *budget]
    procs = [start_launch(common, cwd=tmp_path, data_dir=data_dir) for _ in range(2)]
    results = [finish(p, timeout=1200) for p in procs]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-600:] for r in results]
    search = SearchDir(tmp_path / "runs" / "load")
    records = each_in_one_state(search)
    assert len(records) == 500
    assert all(len(r.attempts) == 1 and len(r.jobs) == 1 for r in records), [r.trial_id for r in records if len(r.attempts) != 1 or len(r.jobs) != 1]
    launches = [json.loads(p.read_text()) for p in (search.path / "launches").glob("*.json")]
    dispatched = [t for launch in launches for t in launch["dispatched"]]
    assert sorted(dispatched) == sorted(r.trial_id for r in records)  # each trial dispatched by exactly one of the two
    assert all(launch["packing"]["size"] > 1 for launch in launches if launch["dispatched"])
    status = parcel_hpc(["status", str(search.path), "--json"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["completed"] == 500
    out = matches_sacct(search)
    tasks = {r.jobs[0] for r in records}
    assert {a["job_id"] for a in out["attempts"]} == tasks  # no orphan: sacct knows exactly the ledger's jobs
