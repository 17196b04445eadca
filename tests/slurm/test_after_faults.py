"""What an on-call admin reads after faults: a trial lost on a DOWN node under a detached pack (on the
fake SLURM, whose node-down behaviour test_slurm_behaviour.py holds to the real cluster's) is seen by
the first ``resubmit --dry-run``, ``status`` and ``logs`` after the scheduler says so; a cancel of
that pack leaves no failure and no running attempt; names SLURM does not know are refused in one
line; and another dev cluster on the machine outlives this suite's daemon kills."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from clusters import ON_FAKE

from parcel_hpc.ledger import AttemptEnd, Cause, EventKind, SearchDir, TrialState
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import REPO, cluster_base, daemons, kill_daemon, restart_daemons, sh, wait_for

SLURM = "hydra/launcher=submitit_slurm"
# Three trials of 82 steps in one job, about a minute each at 0.8 s a step: long enough to act on each
# in turn on a loaded machine. At 41 steps of 0.3 s the last trial could end before the whole cancel
# reached it; at 82 of 0.3 s (25 s) t0001 once completed while the checks after the node failure (a
# dry run, status, logs: seconds each under the suite's load) still ran.
PACK = ["search.n_trials=3", "search.wait=false", "pruner=none", "train.steps=82", "train.step_seconds=0.8", "hydra.launcher.pack_size=3"]


def training(search: SearchDir, tid: str, past: int):
    """(job, node) of the trial's running attempt once it trained past step ``past``; None before."""
    if not (search.trial_dir(tid) / "spec.json").exists():
        return None
    record = search.record(tid)
    started = [e.data for e in search.events(tid) if e.kind is EventKind.STARTED]
    return (started[-1].job_id, started[-1].node) if started and record.state is TrialState.RUNNING and record.step > past else None


def node_failure_reported(job: str) -> bool:
    """squeue lists the job requeued (its restart count) and sacct has filed the NODE_FAIL run."""
    restarts = sh("squeue", "-h", "-j", job, "-O", "RestartCnt", check=False).split()
    states = sh("sacct", "-X", "-n", "-P", "-D", "-j", job, "-o", "State", check=False).split()
    return bool(restarts) and int(restarts[0]) >= 1 and "NODE_FAIL" in states


@ON_FAKE
def test_a_trial_lost_on_a_down_node_is_seen_at_once_and_a_cancel_leaves_no_failure(cluster, tmp_path, data_dir, cluster_guard):
    touched, names = cluster_guard
    names.append("parcel-lostpack")
    res = launch([SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=lostpack", *PACK], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(tmp_path / "runs" / "lostpack")
    path = str(search.path)
    job, node = wait_for(lambda: training(search, "t0000", 11), 180, "t0000 to train past its first milestone")
    touched.append(node)
    sh("scontrol", "update", f"nodename={node}", "state=down", "reason=parcel-test")
    wait_for(lambda: node_failure_reported(job), 60, "squeue and sacct to report the node failure")

    # The first dry run after the scheduler said so lists the lost trial: the requeued pack passes it by.
    dry = parcel_hpc(["resubmit", path, "--dry-run"])
    assert dry.returncode == 0, dry.stderr
    assert "t0000" in dry.stdout and "resubmit" in dry.stdout and "node_fail" in dry.stdout and node in dry.stdout, dry.stdout
    assert search.record("t0000").attempts[-1].how is None  # a dry run changes nothing
    trials = {t["trial_id"]: t for t in json.loads(parcel_hpc(["status", path, "--json"]).stdout)["trials"]}
    assert trials["t0000"]["state"] == "queued" and trials["t0000"]["reason"] == "interrupted: node_fail" and trials["t0000"]["unrecorded"]
    assert trials["t0000"]["scheduler"] == ""  # its job runs again, but not this trial
    logs = parcel_hpc(["logs", path, "t0000"])
    assert logs.returncode == 0 and f"NODE_FAIL on {node}" in logs.stdout and f"on node {node}" in logs.stdout, logs.stdout

    # The requeued pack runs t0001: cancelled alone, it stops itself at its next milestone.
    wait_for(lambda: training(search, "t0001", 11), 180, "the requeued pack to train t0001")
    alone = parcel_hpc(["cancel", path, "--trial", "t0001", "--reason", "one trial"])
    assert alone.returncode == 0, alone.stdout + alone.stderr
    wait_for(lambda: training(search, "t0002", 2), 120, "the pack to go on with t0002")
    whole = parcel_hpc(["cancel", path, "--reason", "halfway"])
    assert whole.returncode == 0, whole.stdout + whole.stderr

    records = {r.trial_id: r for r in search.records()}
    assert {r.state for r in records.values()} == {TrialState.CANCELLED}
    endings = {(t, a.number): (a.how, a.cause) for t, r in records.items() for a in r.attempts}
    assert endings[("t0000", 1)] == (AttemptEnd.INTERRUPTED, Cause.NODE_FAIL)  # sacct's word on its run, not the cancel's
    assert endings[("t0001", 1)] == endings[("t0002", 1)] == (AttemptEnd.INTERRUPTED, Cause.CANCELLED_BY_OWNER), endings
    assert [e.kind for e in search.events("t0001") if e.attempt == 1 and e.kind in (EventKind.ENDED, EventKind.RESOLVED)] == [EventKind.ENDED]
    assert len(endings) == 3  # no attempt is left running, none failed
    logs = parcel_hpc(["logs", path])
    assert logs.returncode == 0 and "has a failed attempt" in logs.stdout and "Traceback" not in logs.stdout, logs.stdout
    reconciled = parcel_hpc(["reconcile", path, "--json", "--wait", "120"], timeout=240)
    assert reconciled.returncode == 0, reconciled.stderr
    flags = json.loads(reconciled.stdout)["campaigns"][0]["flags"]
    assert not [f for f in flags if f["kind"] in ("running_but_ended", "stale_hold")], flags
    (listed,) = json.loads(parcel_hpc(["list", str(tmp_path / "runs"), "--json"]).stdout)["searches"]
    assert listed["launcher"] == "cancelled"
    synced = parcel_hpc(["sync", path])
    # The cancel recorded sacct's record of the runs it ended and restated the holds: nothing left to sync.
    assert synced.returncode == 0 and "recorded 0 resolutions and the scheduler's record of 0 runs; settled 0 budget holds" in synced.stdout, (
        synced.stdout + synced.stderr
    )


@pytest.mark.slurm
def test_names_slurm_does_not_know_are_one_line_and_exit_2(tmp_path, data_dir):
    wrong = parcel_hpc(["reconcile", "--account", "nosuch", "--since", "2026-01-01", "--root", str(tmp_path)])
    assert wrong.returncode == 2 and wrong.stdout == "", wrong.stdout + wrong.stderr
    (line,) = wrong.stderr.strip().splitlines()
    assert "--account nosuch is not an account the scheduler knows" in line and "parcel" in line and "other" in line, line
    launched = launch(
        [SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=nopart", "search.n_trials=1", "resources.partition=nosuch"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    (line,) = [l for l in launched.stderr.splitlines() if l.strip()]
    assert launched.returncode == 2 and "resources.partition=nosuch is not a partition" in line and "high, low" in line, launched.stderr
    assert not (tmp_path / "runs" / "nopart").exists()  # refused before anything was written


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_ports(start: int, offsets: tuple[int, ...]) -> int:
    """The first base from ``start`` at which every base + offset is free to bind on this machine."""
    return next(b for b in range(start, start + 5000, 7) if all(_free(b + o) for o in offsets))


@pytest.mark.slurm
def test_another_dev_cluster_outlives_this_suites_daemon_kills_and_restarts():
    """A second, one-node dev cluster in its own folder and ports, up while the fault tests' helpers
    kill and restart this cluster's daemons: every one of its daemons keeps its pid and it answers;
    then its own down script stops it, and this cluster's daemons outlive that in turn."""
    ours = cluster_base()
    ctld = int(next(l for l in (ours / "etc" / "slurm.conf").read_text().splitlines() if l.startswith("SlurmctldPort=")).split("=")[1])
    port_base = _free_ports(ctld + 500, (0, 2, 101))
    db_port = _free_ports(ctld + 900, (0,))
    base = Path(tempfile.mkdtemp(prefix="pc2-", dir="/tmp"))  # short: its munge socket path must stay under 100 characters
    base.chmod(0o755)  # munged refuses a socket in a folder not everyone may enter
    env = {**os.environ, "NODES": "1", "PORT_BASE": str(port_base), "DB_PORT": str(db_port)}
    theirs_conf = {**os.environ, "SLURM_CONF": str(base / "etc" / "slurm.conf")}
    script = REPO / "scripts"
    try:
        up = subprocess.run(["bash", str(script / "dev-cluster-up.sh"), str(base)], env=env, capture_output=True, text=True, timeout=300)
        assert up.returncode == 0, up.stdout[-1500:] + up.stderr[-1500:]
        theirs = daemons(base)
        assert set(theirs) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1"}, theirs
        for name, sig in (("slurmd-n1", signal.SIGKILL), ("slurmdbd", signal.SIGKILL), ("slurmctld", signal.SIGTERM)):  # as the fault tests do
            kill_daemon(name, sig)  # names the other cluster's daemons share
        restart_daemons()
        assert daemons(base) == theirs
        ping = subprocess.run(["scontrol", "ping"], env=theirs_conf, capture_output=True, text=True, timeout=30)
        assert " is UP" in ping.stdout, ping.stdout + ping.stderr
        restarted = daemons(ours)
        down = subprocess.run(["bash", str(script / "dev-cluster-down.sh"), "--purge", str(base)], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0 and not base.exists(), down.stdout + down.stderr
        assert daemons(ours) == restarted and " is UP" in sh("scontrol", "ping")
    finally:  # whatever failed, the other cluster is stopped by its own script and its folder goes
        subprocess.run(["bash", str(script / "dev-cluster-down.sh"), str(base)], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)
