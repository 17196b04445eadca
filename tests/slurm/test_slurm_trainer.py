"""The examples/ trainer (scikit-learn SGDClassifier) as a SLURM array search on the dev cluster:
milestone pruning applies, and trials preempted by a high-priority job are requeued, resume from
their checkpoints and end with exactly the metric of an uninterrupted run."""

import shutil
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch

from .cluster import PREEMPTOR, preempt, sh, wait_for
from .examples import preempted_and_resumed, running_past

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
TARGET = "parcel_sgd:SGDTrainer"


def test_example_trainer_array_search_prunes_and_resumes_after_preemption(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-sgd", PREEMPTOR]
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=sgd", f"trainer.target={TARGET}", "search.n_trials=12"]
        + ["hydra.launcher.array_parallelism=12", "resources.gpus=1", "train.step_seconds=0.25", "search.wait=false"],
        cwd=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": str(ROOT / "examples")},  # sbatch passes the launch's environment to the jobs
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "sgd")

    node = wait_for(lambda: running_past(search, 10), 180, "a running trial with a checkpoint at step >= 10")
    # A high-priority job wanting all of that node's GPUs preempts every trial on it.
    preempt(node)
    wait_for(lambda: all(search.record(t).state.is_finished() for t in search.trial_ids()), 420, "every trial to finish")

    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    preempted_and_resumed(records)
    reference = reference_run(TARGET, data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    for r in records:
        if r.state.value == "completed":
            assert r.metric == reference(r.spec.params, 82), r.trial_id


def test_a_working_tree_edited_mid_search_and_a_requeue_cannot_touch_the_search(tmp_path, data_dir, cluster_guard):
    """The trainer's package is the user's own checkout. Mid-search they break it and an admin
    requeues a running trial: every attempt, the requeued one's resume included, imports the
    search's copy of the code and ends with the uninterrupted metric; a relaunch from the edited
    checkout is refused at the door."""
    _, names = cluster_guard
    names.append("parcel-sgd-edit")
    lab = tmp_path / "lab"
    shutil.copytree(ROOT / "examples" / "parcel_sgd", lab / "parcel_sgd", ignore=shutil.ignore_patterns("__pycache__"))
    args = ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=sgd-edit", f"trainer.target={TARGET}", "search.n_trials=4"]
    args += [
        "hydra.launcher.array_parallelism=2",
        "hydra.launcher.pack_size=1",
        "resources.gpus=1",
        "train.step_seconds=0.2",
        "pruner=none",
        "search.wait=false",
    ]
    env = {"PYTHONPATH": str(lab)}
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env=env)
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "sgd-edit")

    def running_past_step_10():
        for tid in search.trial_ids():
            rec = search.record(tid)
            started = [e for e in search.events(tid) if e.kind.value == "started"]
            if rec.state.value == "running" and rec.step >= 10 and started:
                return tid, started[-1].data.job_id
        return None

    tid, job = wait_for(running_past_step_10, 180, "a running trial past step 10")
    trainer_py = lab / "parcel_sgd" / "trainer.py"
    trainer_py.write_text(trainer_py.read_text().replace("        self.data = data\n", "        raise RuntimeError('the edited working tree ran')\n", 1))
    sh("scontrol", "requeue", job)
    wait_for(lambda: all(search.record(t).state.is_finished() for t in search.trial_ids()), 420, "every trial to finish")

    records = {r.trial_id: r for r in search.records()}
    assert {r.state.value for r in records.values()} == {"completed"}, {t: (r.state.value, r.reason) for t, r in records.items()}
    requeued = records[tid]
    assert len(requeued.attempts) >= 2 and requeued.attempts[-1].resumed_from > 0, requeued.attempts
    reference = reference_run(TARGET, data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    for r in records.values():
        assert r.metric == reference(r.spec.params, 82), r.trial_id
    again = launch(args[:-1] + ["search.n_trials=5"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "reject:trainer", again.stdout + again.stderr
