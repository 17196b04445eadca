"""The examples/ trainer (scikit-learn's SGDClassifier with partial_fit) run end to end on the local
executor: milestones and pruning apply to it, and a trial signalled mid-run resumes to exactly the
metric of an uninterrupted run."""

import functools
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.testing.runs import signalled_once
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
    # The signal was held to the next step boundary and the state saved there: the rerun resumes at
    # exactly the step the interrupted attempt reached, whatever the checkpoint cadence (``signalled_once``).
    rec = signalled_once([f"trainer.target={TARGET}", "pruner=none", "train.step_seconds=0.08"], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert 10 <= rec.attempts[0].step < 82
    assert rec.metric == uninterrupted(rec.spec.params)
