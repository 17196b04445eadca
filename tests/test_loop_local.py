"""The function form end to end on the local executor (issue 46): a plain PyTorch loop kept as it is
(examples/parcel_loop) runs a search with pruning, and a trial signalled mid-run saves at the next
step its loop tells the run of and resumes to exactly the uninterrupted metric."""

import functools
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch
from parcel_hpc.testing.runs import signalled_once

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "parcel_loop:train"
ENV = {"PYTHONPATH": str(ROOT / "examples")}
SPACE = ["~space.params.hidden", "~space.params.l2", "batch_size=choice(16,32)", "lr=choice(0.0003,0.03)", "train.steps=120"]


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    """The metric a trial's params reach in 120 uninterrupted steps, computed in this process."""
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=120)


def test_a_search_with_a_loop_of_its_own_prunes_and_completes(tmp_path, data_dir, uninterrupted):
    args = [f"search.root={tmp_path}", "search.revision=loop", f"trainer.target={TARGET}", "search.n_trials=6", *SPACE]
    # One trial at a time, a milestone where the learning rates part: the small one is pruned behind the large one.
    args += ["hydra.launcher.parallelism=1", "pruner.milestones=[82,120]", "pruner.min_peers=1"]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "loop")
    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 82 and set(milestones[0].train) == {"loss", "lr"}  # the loop's own metrics ride along
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params)


def test_a_signalled_loop_saves_at_its_next_step_and_resumes_exactly(tmp_path, data_dir, uninterrupted):
    # The flag is read at the loop's next run.stepped, which says a checkpoint is due: the rerun resumes
    # at exactly the step the interrupted attempt reached, whatever the cadence (``signalled_once``).
    rec = signalled_once([f"trainer.target={TARGET}", "pruner=none", "train.step_seconds=0.08", *SPACE], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert 10 <= rec.attempts[0].step < 120
    assert rec.metric == uninterrupted(rec.spec.params)
