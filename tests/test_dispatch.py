"""One conformance suite for the dispatcher interface, run against every implementation: the local
executor, SLURM on the fake cluster (``parcel_hpc.testing.fakeslurm``, the fast tier) and on the real
dev cluster (``slurm``-marked). tests/test_slurm_behaviour.py holds the fake to the real cluster's
behaviour below the dispatcher (sacct's rows, squeue's reasons, requeue, preemption)."""

import os
import subprocess
import time
import uuid

import pytest
from clusters import ON_BOTH, ON_FAKE
from submitit.slurm import slurm as submitit_slurm

from parcel_hpc import anchor
from parcel_hpc.errors import UsageError
from parcel_hpc.identity import SearchIdentity
from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings
from parcel_hpc.scheduler.factory import executor_kind, make_dispatcher
from parcel_hpc.scheduler.local.dispatcher import LocalDispatcher
from parcel_hpc.scheduler.slurm.dispatcher import SlurmDispatcher, sbatch_parameters, submitit_batch_script
from parcel_hpc.testing import SleepTask

BUDGET = {"max_retries": 2, "max_preemptions": 10}
RESOURCES = {"gpus": 0, "cpus": 1, "mem_gb": 0.1, "time_limit_min": 2, "partition": None, "account": None, "qos": None}


def acting_for(dispatcher: Dispatcher, search: SearchDir) -> Dispatcher:
    """The dispatcher told which search directory its jobs act for, as a launch tells it at its door."""
    search.path.mkdir(exist_ok=True)
    dispatcher.acts_for(anchor.identify(search.path))
    return dispatcher


def local(tmp_path) -> Dispatcher:
    settings = LauncherSettings(Executor("local"), {"parallelism": 2, "signal_delay_s": 5}, RESOURCES, BUDGET)
    search = SearchDir(tmp_path / "search")
    return acting_for(make_dispatcher(settings, search), search)


def slurm(tmp_path) -> Dispatcher:
    name = f"parcel-conformance-{uuid.uuid4().hex[:6]}"
    settings = LauncherSettings(Executor("slurm"), {"job_name": name, "array_parallelism": 4, "signal_delay_s": 5}, RESOURCES, BUDGET)
    search = SearchDir(tmp_path / "search")
    return acting_for(make_dispatcher(settings, search), search)


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def conformance(dispatcher: Dispatcher, tmp_path, while_recording=lambda submitted: None) -> None:
    """submit records every job id before returning; alive, cancel and describe answer for them;
    cancel ends jobs that are already running their task (a job still starting dies of any signal)."""
    dispatcher.check()
    assert dispatcher.capacity() >= 2 and dispatcher.slots() >= 2
    assert "3" in dispatcher.describe([1, 2])
    recorded = []

    def record(submitted):
        while_recording(submitted)
        recorded.extend(submitted)

    started = [tmp_path / "t0000.started", tmp_path / "t0001.started"]
    # The second task is a pack: two trials, one job (they share its id).
    tasks = [SleepTask("t0000", 120, started[0]), SleepTask("t0001", 120, started[1], packed_with=("t0002",))]
    submitted = dispatcher.submit(tasks, record)
    assert [s.trial_id for s in submitted] == ["t0000", "t0001", "t0002"] and recorded == submitted
    assert len({s.job_id for s in submitted}) == 2 and submitted[1].job_id == submitted[2].job_id
    dispatcher.refresh()
    assert all(dispatcher.alive(s.trial_id, s.job_id) for s in submitted)
    wait_until(lambda: all(p.exists() for p in started), 60, "both jobs to run their task")
    dispatcher.cancel([s.job_id for s in submitted])

    def all_gone():
        dispatcher.refresh()
        return not any(dispatcher.alive(s.trial_id, s.job_id) for s in submitted)

    wait_until(all_gone, 30, "the cancelled jobs to end")


def test_local_dispatcher_conforms(tmp_path):
    d = local(tmp_path)
    assert isinstance(d, LocalDispatcher) and not d.can_detach
    conformance(d, tmp_path)


@ON_BOTH
def test_slurm_dispatcher_conforms(tmp_path, cluster):
    d = slurm(tmp_path)
    assert isinstance(d, SlurmDispatcher) and d.can_detach

    def held(submitted):  # nothing may start before the ledger has the ids
        out = subprocess.run(["squeue", "-h", "-r", f"--name={d.job_name}", "-o", "%i %r"], capture_output=True, text=True, check=True).stdout
        rows = dict(line.split() for line in out.splitlines())
        assert {s.job_id for s in submitted} <= set(rows), rows
        assert all(reason.startswith("JobHeld") for reason in rows.values()), rows

    try:
        conformance(d, tmp_path, held)
    finally:
        subprocess.run(["scancel", f"--name={d.job_name}"], check=False)


def test_submitit_private_batch_script_api_still_exists(tmp_path):
    """The dry run prints submitit's own batch script through its one private function: if submitit
    renames it or changes what it takes, this fails here rather than in a user's dry run."""
    assert callable(getattr(submitit_slurm, "_make_sbatch_string", None)), (
        "submitit dropped _make_sbatch_string: update parcel_hpc/scheduler/slurm/dispatcher.py"
    )
    settings = LauncherSettings(Executor("slurm"), {"job_name": "parcel-x", "array_parallelism": 3, "signal_delay_s": 60}, {**RESOURCES, "gpus": 1}, BUDGET)
    identity = SearchIdentity("0123456789abcdef" * 2, "sha256:" + "c" * 64)
    params = {**sbatch_parameters(settings, identity, "rev-a"), "map_count": 5}
    script = submitit_batch_script("python -u -m submitit.core._submit /f", tmp_path, params)
    expected = (
        "#SBATCH --array=0-4%3",
        "#SBATCH --job-name=parcel-x-0123456789ab",
        "#SBATCH --wckey=parcel-x-0123456789ab",
        f"#SBATCH --comment=parcel-hpc:search={identity.search_id}:revision=rev-a:contract=sha256:{'c' * 64}",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --hold",
        "#SBATCH --signal=USR2@60",
    )
    for line in expected:
        assert line in script, (line, script)
    # A search frozen before search ids existed keeps its bare job name.
    assert "#SBATCH --job-name=parcel-x\n" in submitit_batch_script("python", tmp_path, {**sbatch_parameters(settings), "map_count": 1})


def test_an_unknown_launcher_kind_is_bad_input(tmp_path):
    with pytest.raises(UsageError, match="submitit_local or submitit_slurm"):
        executor_kind("kubernetes")


def test_local_jobs_of_another_launch_are_seen_through_the_process_table(tmp_path):
    launched = local(tmp_path)
    (job,) = launched.submit([SleepTask("t0000", 120, tmp_path / "started")], lambda submitted: None)
    wait_until(lambda: (tmp_path / "started").exists(), 60, "the job to run")
    other = local(tmp_path)  # another launch, or `parcel-hpc cancel`: it knows the job only by its pid
    assert other.alive("t0000", job.job_id)
    assert not other.alive("t9", str(os.getpid()))  # a live pid that is no submitit job (a recycled pid)
    assert not other.alive("t9", "not-a-pid")
    other.cancel([job.job_id, str(os.getpid())])  # signals the job only, never the pid that is not one
    wait_until(lambda: not other.alive("t0000", job.job_id), 30, "the job to end")


@ON_FAKE
def test_a_dry_run_of_trials_of_several_shapes_says_each_shape_is_an_array_of_its_own(tmp_path, cluster):
    resources = {**RESOURCES, "shape_by": "width", "shapes": {8: {"nodes": 2, "tasks_per_node": 2}}}
    settings = LauncherSettings(Executor("slurm"), {"job_name": "parcel-shapes", "array_parallelism": 4, "signal_delay_s": 5}, resources, BUDGET)
    search = SearchDir(tmp_path / "search")
    text = acting_for(make_dispatcher(settings, search), search).describe([1, 1])
    assert "# trials of 2 shapes (0 GPU, 2 nodes x 2 ranks x 0 GPU): an array per shape" in text
    one = LauncherSettings(Executor("slurm"), settings.params, RESOURCES, BUDGET)
    assert "an array per shape" not in acting_for(make_dispatcher(one, search), search).describe([1, 1])  # one shape: as before
