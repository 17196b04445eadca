"""The function form end to end on the local executor (issue 46): a plain PyTorch loop kept as it is
(examples/parcel_loop) runs a search with pruning, and a trial signalled mid-run saves at the next
step its loop tells the run of and resumes to exactly the uninterrupted metric."""

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

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "parcel_loop:train"
ENV = {"PYTHONPATH": str(ROOT / "examples")}
SPACE = ["~space.params.hidden", "~space.params.l2", "batch_size=choice(16,32)", "lr=choice(0.0003,0.03)"]


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    """The metric a trial's params reach in 82 uninterrupted steps, computed in this process."""
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=82)


def test_a_search_with_a_loop_of_its_own_prunes_and_completes(tmp_path, data_dir, uninterrupted):
    args = [f"search.root={tmp_path}", "search.revision=loop", f"trainer.target={TARGET}", "search.n_trials=4", "pruner.min_peers=1", *SPACE]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "loop")
    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 10 and set(milestones[0].train) == {"loss", "lr"}  # the loop's own metrics ride along
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params)


def test_a_signalled_loop_saves_at_its_next_step_and_resumes_exactly(tmp_path, data_dir, uninterrupted):
    argv = [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={tmp_path}", "search.revision=sig", f"trainer.target={TARGET}"]
    argv += ["search.n_trials=1", "pruner=none", "train.step_seconds=0.08", *SPACE]
    launcher = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    search = SearchDir(tmp_path / "sig")
    ckpt_dir = tmp_path / "sig" / "checkpoints" / "t0000"
    wait_for(lambda: any(ckpt_dir.glob("ckpt-*.h5")), 120, "a first checkpoint")
    started = [e for e in search.events("t0000") if e.kind.value == "started"][-1]
    os.kill(started.data.pid, signal.SIGUSR2)  # what submitit's controller sends at the time limit
    _, err = launcher.communicate(timeout=180)
    assert launcher.returncode == 0, err
    rec = search.record("t0000")
    first, second = rec.attempts
    assert (first.how.value, first.cause.value) == ("interrupted", "timeout")
    assert 10 <= first.step < 82
    # The flag was read at the loop's next run.stepped, which said a checkpoint was due: the rerun
    # resumes at exactly the step the interrupted attempt reached, whatever the cadence.
    assert second.resumed_from == first.step and second.how.value == "completed"
    assert rec.metric == uninterrupted(rec.spec.params)
