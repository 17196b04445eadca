"""A search that cannot produce a result stops on the real dev cluster: the first trials failing
alike hold it and cancel the array tasks not yet started; a worker whose environment drifted from
the contract stops it with the trials not yet run left queued, and the same command, once the
environment matches again, runs them. ``parcel-hpc logs`` reads the SLURM job's own output files."""

import pytest

from parcel_hpc.ledger import AttemptEnd, EventKind, SearchDir, TrialState
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch

from .cluster import sh, wait_for

pytestmark = pytest.mark.slurm

SLURM = "hydra/launcher=submitit_slurm"
# One trial a task, two tasks at a time: most of the array is still pending when the stop comes.
ONE_A_TASK = ("pruner=none", "train.steps=20", "resources.gpus=0", "hydra.launcher.pack_size=1", "hydra.launcher.array_parallelism=2")


def overrides(tmp_path, rev, *more):
    return [SLURM, f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *ONE_A_TASK, *more]


# Every trial fails at step 5, a second a step: the first three results (each retried once to see that
# it reproduces) come long before the twenty tasks, two at a time, could all have started.
FAILING_ALIKE = ("search.n_trials=20", "train.step_seconds=1.0", "trainer.target=parcel_hpc.testing.trainers:MissingParam")


def queued_jobs(name: str) -> list[str]:
    return [line for line in sh("squeue", "-h", "-o", "%i|%j", check=False).splitlines() if f"|{name}" in line]


def test_trials_failing_alike_hold_the_search_and_cancel_the_tasks_not_started(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-sysfail")
    res = launch(overrides(tmp_path, "sysfail", *FAILING_ALIKE), cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    out = [l for l in res.stdout.splitlines() if l.strip()]
    assert out[-1] == "hold:systematic-failure" and "parcel-hpc select" not in res.stdout
    why = [l for l in res.stderr.splitlines() if l.strip()][-1]
    assert "failed alike: exception KeyError: 'width_multiplier'" in why and "parcel-hpc logs" in why, why
    search = SearchDir(tmp_path / "runs" / "sysfail")
    held = search.hold()
    assert held is not None and len(held["trials"]) == 3
    records = list(search.records())
    assert all(search.record(t).state is TrialState.FAILED for t in held["trials"])
    assert {r.state for r in records} <= {TrialState.FAILED, TrialState.QUEUED}
    assert any(not r.attempts for r in records), [(r.trial_id, len(r.attempts)) for r in records]  # some never ran
    assert not queued_jobs("parcel-sysfail")  # nothing of the search is left in the queue
    # logs: the ledger's traceback and the SLURM job's output file, by the job's own id
    first = search.record(held["trials"][0])
    job = first.attempts[-1].job_id
    logs = parcel_hpc(["logs", str(search.path), first.trial_id])
    assert logs.returncode == 0, logs.stderr
    assert "Traceback (most recent call last)" in logs.stdout and "KeyError: 'width_multiplier'" in logs.stdout
    err_file = search.path / "submitit" / "slurm" / job / f"{job}_0_log.err"
    assert str(err_file) in logs.stdout and err_file.read_text().splitlines()[-1] in logs.stdout
    # the hold stands for a relaunch of the same contract: nothing more is submitted
    again = launch(overrides(tmp_path, "sysfail", *FAILING_ALIKE), cwd=tmp_path, data_dir=data_dir)
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "hold:systematic-failure", again.stdout + again.stderr
    assert sum(len(r.jobs) for r in search.records()) == sum(len(r.jobs) for r in records)


def test_drift_mid_search_stops_it_and_the_same_command_runs_the_rest_once_it_matches(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-sdrift")
    archive = tmp_path / "image.sif"  # on the filesystem the nodes share
    archive.write_bytes(b"image one")
    argv = overrides(tmp_path, "sdrift", "search.n_trials=6", "image=archive", f"image.path={archive}", "train.step_seconds=0.3")
    argv = [a if a != "hydra.launcher.array_parallelism=2" else "hydra.launcher.array_parallelism=1" for a in argv]
    proc = start_launch(argv, cwd=tmp_path, data_dir=data_dir)
    search = SearchDir(tmp_path / "runs" / "sdrift")
    admitted = lambda: (search.trial_dir("t0000") / "spec.json").exists() and any(e.kind is EventKind.ADMITTED for e in search.events("t0000"))  # noqa: E731
    wait_for(admitted, 180, "t0000 admitted by its worker")
    archive.write_bytes(b"image two")  # the image is rebuilt under the running search
    res = finish(proc, timeout=600)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert [l for l in res.stdout.splitlines() if l.strip()][-1] == "reject:image_digest"
    assert "parcel-hpc select" not in res.stdout
    why = [l for l in res.stderr.splitlines() if l.strip()][-1]
    assert "this worker sees image_digest" in why and "restore the environment and relaunch the same command to run the 5 queued trials" in why, why
    records = {r.trial_id: r for r in search.records()}
    assert records["t0000"].state is TrialState.COMPLETED  # admitted before the change: it ran on
    assert records["t0001"].state is TrialState.QUEUED and records["t0001"].attempts[-1].how is AttemptEnd.REJECTED
    assert all(records[t].state is TrialState.QUEUED for t in records if t != "t0000")
    assert not records["t0005"].attempts  # never ran against anything
    assert not queued_jobs("parcel-sdrift")  # the tasks not yet started were cancelled
    archive.write_bytes(b"image one")  # restored
    again = launch(argv, cwd=tmp_path, data_dir=data_dir)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert [r.state for r in search.records()] == [TrialState.COMPLETED] * 6
    assert "parcel-hpc select" in again.stdout
