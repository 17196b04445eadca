"""The examples/ trainer (scikit-learn's SGDClassifier with partial_fit) run end to end on the local
executor: milestones and pruning apply to it, and a trial signalled mid-run resumes to exactly the
metric of an uninterrupted run."""

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.testing.runs import subprocess_env, wait_for
from parcel_hpc.trainer import trainer_identity

ROOT = Path(__file__).resolve().parents[1]
TARGET = "parcel_sgd:SGDTrainer"
ENV = {"PYTHONPATH": str(ROOT / "examples")}


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    """The metric a trial's params reach in 82 uninterrupted steps, computed in this process."""
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=82)


def test_a_search_with_the_example_trainer_prunes_and_completes(tmp_path, data_dir, uninterrupted, monkeypatch):
    res = launch(
        [f"search.root={tmp_path}", "search.revision=sgd", f"trainer.target={TARGET}", "search.n_trials=12", "hydra.launcher.parallelism=2"],
        cwd=tmp_path,
        data_dir=data_dir,
        env=ENV,
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "sgd")
    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 10 and "loss" in milestones[0].train  # the trainer's own metrics ride along
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params)
    monkeypatch.syspath_prepend(ENV["PYTHONPATH"])  # import the example here, as the workers did
    assert search.contract()["trainer"] == trainer_identity(TARGET)


def test_a_signalled_trial_checkpoints_between_steps_and_resumes_exactly(tmp_path, data_dir, uninterrupted):
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={tmp_path}", "search.revision=sig", f"trainer.target={TARGET}"]
    argv += ["search.n_trials=1", "pruner=none", "train.step_seconds=0.08"]
    launcher = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    search = SearchDir(tmp_path / "sig")
    ckpt_dir = tmp_path / "sig" / "checkpoints" / "t0000"
    wait_for(lambda: any(ckpt_dir.glob("ckpt-*.h5")), 60, "a first checkpoint")
    started = [e for e in search.events("t0000") if e.kind.value == "started"][-1]
    os.kill(started.data.pid, signal.SIGUSR2)  # what submitit's controller sends at the time limit
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    rec = search.record("t0000")
    first, second = rec.attempts
    assert (first.how.value, first.cause.value) == ("interrupted", "timeout")
    assert 10 <= first.step < 82
    # The signal was held to the next step boundary and the state saved there: the rerun resumes at
    # exactly the step the interrupted attempt reached, whatever the checkpoint cadence.
    assert second.resumed_from == first.step and second.how.value == "completed"
    assert rec.metric == uninterrupted(rec.spec.params)
