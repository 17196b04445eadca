"""SLURM's behaviour at the process boundary, one suite run against the fake cluster (the fast tier)
and the real dev cluster (``slurm``-marked): what sacct files for each way a job ends, what squeue
says a pending job waits for, the environment a job sees, a requeue, a preemption, a node going
down. The real cluster is the reference: a test that passes on the fake and fails here names a
place where the fake drifted from SLURM. The same text goes through the project's own argv and
parsers (``build_sacct_argv``, ``parse_sacct``, ``parse_squeue``)."""

import datetime as dt
import os
import uuid
from pathlib import Path

import pytest
from clusters import ON_BOTH

from parcel_hpc.scheduler.base import QueueState
from parcel_hpc.scheduler.slurm import queue
from parcel_hpc.scheduler.slurm.sacct import build_sacct_argv, run_sacct
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct

from .cluster import PREEMPTOR, preempt, sh, wait_for, what_the_cluster_says

pytestmark = ON_BOTH


def unique(prefix: str, names: list[str]) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    names.append(name)
    return name


def submit(name: str, command: str, *options: str) -> str:
    return sh("sbatch", "--parsable", "-J", name, "--mem=100M", "-t", "5", "-o", "/dev/null", *options, "--wrap", command).strip()


# The dev cluster's database outlives its controller's job ids: an id asked for alone can be an old job's too.
SINCE = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)


def rows(job: str) -> list[dict[str, str]]:
    """sacct's rows for ``job`` as the project asks for them (every run and step), after parse_sacct accepted them."""
    text = run_sacct(build_sacct_argv([job], since=SINCE))
    assert len(parse_sacct(text)) == len(text.splitlines())
    fields = ("job_id", "raw", "name", "state", "exit")
    return [dict(zip(fields, line.split("|")[:5], strict=True)) for line in text.decode().splitlines()]


def _runs_as(pid_file: Path, command: str) -> bool:
    """The process whose pid ``pid_file`` holds runs ``command`` now (every node runs on this machine)."""
    pid = pid_file.read_text().strip() if pid_file.exists() else ""
    try:
        return pid.isdigit() and Path(f"/proc/{pid}/comm").read_text().strip() == command
    except OSError:
        return False


def ended(job: str, timeout: float = 60) -> list[dict[str, str]]:
    """The rows once the job's record is final: no run still open, and its last run not one SLURM requeues after."""

    def final():
        r = rows(job)
        runs = [x["state"] for x in r if "." not in x["job_id"]]
        return r if runs and runs[-1] not in ("REQUEUED", "PREEMPTED", "NODE_FAIL") and all(x["state"] not in ("RUNNING", "PENDING") for x in r) else None

    return wait_for(final, timeout, f"job {job}'s final record")


def gone(name: str) -> bool:
    return not queue.queued_jobs(name)


def test_each_way_a_job_ends_is_filed_as_slurm_files_it(cluster, cluster_guard, tmp_path):
    _, names = cluster_guard
    name = unique("beh-end", names)
    done, failed, killed = submit(name, "true"), submit(name, "exit 3"), submit(name, "kill -KILL $$")
    started = tmp_path / "started"
    cancelled = submit(name, f"echo $$ > {started}; exec sleep 280")  # cancelled long before it could end
    # Cancelled once its script sleeps (one cancelled between the shell's lines may file its batch step
    # FAILED 15:0) ...
    wait_for(lambda: _runs_as(started, "sleep"), 60, "the job's script to sleep")
    # ... and once slurmdbd holds its start (the job under its name, its batch step): a job cancelled
    # before its start reached the database is filed under the name "allocation".
    wait_for(lambda: {(r["name"], r["state"]) for r in rows(cancelled)} >= {(name, "RUNNING"), ("batch", "RUNNING")}, 60, "sacct to file the job running")
    sh("scancel", cancelled)
    assert [(r["state"], r["exit"]) for r in ended(done)] == [("COMPLETED", "0:0"), ("COMPLETED", "0:0")]
    assert [(r["state"], r["exit"]) for r in ended(failed)] == [("FAILED", "3:0"), ("FAILED", "3:0")]
    assert [(r["state"], r["exit"]) for r in ended(killed)] == [("FAILED", "0:9"), ("CANCELLED", "0:9")]
    assert [(r["state"], r["exit"], r["name"]) for r in ended(cancelled)] == [(f"CANCELLED by {os.getuid()}", "0:0", name), ("CANCELLED", "0:15", "batch")]


def test_a_held_throttled_array_waits_as_squeue_says_and_its_last_task_carries_the_array_id(cluster, cluster_guard):
    _, names = cluster_guard
    name = unique("beh-arr", names)
    array = submit(name, "sleep 8", "--hold", "--array=0-3%2")  # the throttle shows while two tasks run: 8 s to see it
    held = queue.queued_jobs(name)
    assert sorted(held) == [f"{array}_{i}" for i in range(4)]
    assert {(q.state, q.reason, q.restarts) for q in held.values()} == {(QueueState.PENDING, "JobHeldUser", 0)}
    queue.release([array])
    waiting = wait_for(lambda: [q for q in queue.queued_jobs(name).values() if q.reason == "JobArrayTaskLimit"], 30, "the throttle")
    assert waiting and sum(q.state is QueueState.RUNNING for q in queue.queued_jobs(name).values()) <= 2
    wait_for(lambda: gone(name), 60, "the array to end")
    # slurmdbd files a task a moment after squeue stops listing it: wait for all four, bounded.
    expected = [f"{array}_{i}" for i in range(4)]

    def filed():
        tasks = {r["job_id"]: r["raw"] for r in ended(array) if "." not in r["job_id"]}
        return tasks if sorted(tasks) == expected else None

    tasks = wait_for(filed, 30, "sacct to file every task")
    assert sorted(tasks) == expected and tasks[f"{array}_3"] == array


def test_one_squeue_lists_the_jobs_of_every_name_asked_and_no_other(cluster, cluster_guard):
    _, names = cluster_guard
    first, second, other = unique("beh-qa", names), unique("beh-qb", names), unique("beh-qc", names)
    jobs = [submit(first, "true", "--hold"), submit(second, "true", "--hold")]
    submit(other, "true", "--hold")
    assert sorted(queue.queued_jobs(first, second)) == sorted(jobs) and queue.queued_jobs() == {}
    sh("scancel", f"--name={first},{second},{other}")


def test_a_job_sees_its_slurm_environment(cluster, cluster_guard, tmp_path):
    _, names = cluster_guard
    name = unique("beh-env", names)
    out = tmp_path / "env"
    array = submit(name, f"env | grep -E '^(SLURM_|CUDA_VISIBLE)' > {out}_$SLURM_ARRAY_TASK_ID", "--array=0-1", "--gres=gpu:2")
    wait_for(lambda: gone(name), 60, "the array to end")
    for task in (0, 1):
        env = dict(line.split("=", 1) for line in Path(f"{out}_{task}").read_text().splitlines())
        assert env["SLURM_ARRAY_JOB_ID"] == array and env["SLURM_ARRAY_TASK_ID"] == str(task) and env["SLURM_JOB_NAME"] == name
        assert env["SLURM_JOB_NODELIST"] in ("n1", "n2", "n3") and env["SLURM_PROCID"] == "0" and "SLURM_NTASKS" not in env  # srun's
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and "SLURM_RESTART_COUNT" not in env


def test_a_requeued_job_runs_again_and_says_how_often(cluster, cluster_guard, tmp_path):
    _, names = cluster_guard
    name = unique("beh-rq", names)
    marker = tmp_path / "runs"
    # The first run outlasts any delay before the requeue (it is requeued mid-sleep); the second, 5 s.
    job = submit(name, f'echo "${{SLURM_RESTART_COUNT:-0}}" >> {marker}; [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ] && sleep 5 || sleep 280')
    wait_for(lambda: marker.exists(), 60, "the first run")
    sh("scontrol", "requeue", job)
    wait_for(lambda: (q := queue.queued_jobs(name).get(job)) is not None and q.restarts == 1, 60, "squeue's restart count")
    final = ended(job, 180)
    assert [(r["state"], r["exit"]) for r in final if "." not in r["job_id"]] == [("REQUEUED", "0:0"), ("COMPLETED", "0:0")]
    assert marker.read_text().split() == ["0", "1"]


def test_a_higher_partition_preempts_and_the_job_is_requeued_after_its_grace(cluster, cluster_guard, tmp_path):
    touched, names = cluster_guard
    names.append(PREEMPTOR)
    name = unique("beh-pre", names)
    marker = tmp_path / "signals"
    # It runs until preempted (then cancelled): a job that could end first raced a slow scheduler once (CI).
    job = submit(name, f"trap 'echo TERM >> {marker}; exit 0' TERM; echo run >> {marker}; sleep 280 & wait", "-w", "n2", "--gres=gpu:4")
    wait_for(lambda: marker.exists(), 60, "the job to run")
    preempt("n2")
    try:
        wait_for(lambda: "TERM" in marker.read_text(), 150, "SIGTERM at the preemption")
    except AssertionError as exc:  # once in CI (a loaded machine): where the job and the preemptor stood
        raise AssertionError(f"{exc}\n{what_the_cluster_says(name)}\n{what_the_cluster_says(PREEMPTOR)}") from None
    assert "PreemptTime=None" not in sh("scontrol", "show", "job", job)
    wait_for(lambda: marker.read_text().count("run") == 2, 120, "the requeued run")
    sh("scancel", job)
    runs = [r for r in ended(job, 120) if "." not in r["job_id"]]
    assert [r["state"] for r in runs] == ["PREEMPTED", f"CANCELLED by {os.getuid()}"]


def test_a_node_going_down_fails_its_job_and_slurm_requeues_it(cluster, cluster_guard, tmp_path):
    # One node: the requeued job waits for it (pending), so the test ends it with scancel.
    touched, names = cluster_guard
    name = unique("beh-down", names)
    marker = tmp_path / "runs"
    job = submit(name, f"echo run >> {marker}; sleep 280", "-w", "n3")  # ended by the node, then scancel
    wait_for(lambda: marker.exists(), 60, "the job to run")
    touched.append("n3")
    sh("scontrol", "update", "nodename=n3", "state=down", "reason=behaviour-test")
    wait_for(lambda: (q := queue.queued_jobs(name).get(job)) is not None and q.restarts == 1 and q.state is QueueState.PENDING, 60, "the requeue")
    sh("scancel", job)
    runs = [r for r in ended(job) if "." not in r["job_id"]]
    assert [r["state"] for r in runs][:1] == ["NODE_FAIL"]


def test_a_down_controller_and_a_down_database_are_errors_not_empty_answers(cluster, tmp_path):
    if cluster is None:
        pytest.skip("the real daemons' faults are tests/slurm/test_faults.py's (they restart the cluster)")
    from parcel_hpc.errors import AccountingError, SchedulerUnavailable

    cluster.set_down("dbd")
    with pytest.raises(AccountingError, match="Problem talking to the database"):
        run_sacct(build_sacct_argv(["1"]))
    cluster.set_down("controller")
    with pytest.raises(SchedulerUnavailable, match="slurmctld is not answering"):
        queue.check_reachable()
    with pytest.raises(SchedulerUnavailable, match="squeue --noheader failed"):
        queue.queued_jobs("any")
