"""Checkpoints written off the training path, on the local executor with real signals (issue 49): a
trial sent the scheduler's signal while its cadence save is still being written saves again at the
next step, both saves complete, and the requeued attempt resumes to exactly the uninterrupted metric."""

import numpy as np
from reference import reference_run

from parcel_hpc.checkpoints import format as ckpt_format
from parcel_hpc.checkpoints.store import step_files
from parcel_hpc.ledger import AttemptEnd, SearchDir
from parcel_hpc.testing import faults, launch
from parcel_hpc.worker.training import STEP_HOOK_ENV

TARGET = "parcel_hpc.testing.trainers:CarriesBallast"
STEPS, EVERY, SIGNAL_AT = 12, 5, 6  # the cadence saves step 5; the signal comes after step 6, while it is written


def test_a_signal_during_a_cadence_save_saves_both_and_resumes_exactly(tmp_path, data_dir, artifacts):
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {STEP_HOOK_ENV: faults.SAVING_HOOK, faults.INTERRUPT_STEP_ENV: str(SIGNAL_AT), faults.MARKERS_ENV: str(markers)}
    overrides = ["search.n_trials=1", "pruner=none", f"train.steps={STEPS}", f"checkpoint.every_steps={EVERY}", "checkpoint.keep_last=100"]
    res = launch(
        [f"search.root={tmp_path / 'runs'}", "search.revision=bg-r1", f"trainer.target={TARGET}", *overrides], cwd=tmp_path, data_dir=data_dir, env=env
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert [m.read_text() for m in markers.iterdir()] == ["writing"]  # the signal came while step 5's save was written
    search = SearchDir(tmp_path / "runs" / "bg-r1")
    record = search.record("t0000")
    first, second = record.attempts
    assert first.how is AttemptEnd.INTERRUPTED and first.step == SIGNAL_AT and second.how is AttemptEnd.COMPLETED
    resumed = [e.data.step for e in search.events("t0000") if e.kind.value == "resumed"]
    assert resumed == [SIGNAL_AT]
    # Both saves are whole, each with its own step's arrays (copied out before the next step changed them).
    directory = tmp_path / "runs" / "bg-r1" / "checkpoints" / "t0000"
    assert [s for s, _ in step_files(directory)] == [EVERY, SIGNAL_AT, 10, STEPS]
    for step, path in step_files(directory):
        ckpt = ckpt_format.read(path)  # its digests verified
        assert ckpt.step == step and ckpt.meta["trial_id"] == "t0000" and np.all(ckpt.params["ballast"] == step), step
    uninterrupted = reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"])
    assert record.metric == uninterrupted(record.spec.params, STEPS)


def test_a_cadence_in_seconds_saves_once_that_much_training_has_passed(tmp_path, data_dir):
    """Steps of at least 0.05 s and a checkpoint every 0.2 s of training: saves at least 4 steps
    apart, some before the last step (which is always saved)."""
    overrides = ["search.n_trials=1", "pruner=none", "train.steps=30", "train.step_seconds=0.05", "checkpoint.every_s=0.2", "checkpoint.keep_last=100"]
    res = launch([f"search.root={tmp_path / 'runs'}", "search.revision=s-r1", *overrides], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr[-2000:]
    steps = [s for s, _ in step_files(tmp_path / "runs" / "s-r1" / "checkpoints" / "t0000")]
    assert steps[-1] == 30 and len(steps) >= 3, steps
    assert all(b - a >= 4 for a, b in zip(steps[:-2], steps[1:-1])), steps  # the last is saved whenever it comes
