"""Lightning's ``Trainer.fit`` kept as it is (examples/parcel_lightning, the ``Governed`` callback) as a
SLURM array search on the dev cluster: trials preempted mid-epoch by a high-priority job read the
scheduler's signal at their next optimizer step, save Lightning's own checkpoint into the trial's
checkpoint, are requeued, resume with ``trainer.fit(ckpt_path=...)`` and report at every milestone
exactly the values of an uninterrupted run. On the CPU (resources.gpus=0), as test_slurm_cnn.py."""

import pytest

pytest.importorskip("lightning")  # the [lightning] extra; scripts/test.sh installs it beside the CPU torch

from reference import EXAMPLES, reference_run  # noqa: E402

from parcel_hpc.ledger import MetricResume, SearchDir  # noqa: E402
from parcel_hpc.testing import launch  # noqa: E402

from .cluster import PREEMPTOR, preempt, wait_for  # noqa: E402
from .examples import preempted_and_resumed, running_past  # noqa: E402

pytestmark = pytest.mark.slurm

TARGET = "parcel_lightning:train"
MILESTONES = (10, 20, 41, 82)  # pruner=none's grid, validated all the same
PER_EPOCH = 56  # 891 train frames in batches of 16


def test_a_lightning_fit_preempted_on_slurm_mid_epoch_resumes_with_every_milestone_exact(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-lightning", PREEMPTOR]
    args = ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=lightning", f"trainer.target={TARGET}", "search.n_trials=1"]
    args += ["~space.params.hidden", "~space.params.l2", "batch_size=choice(16)", "lr=choice(0.03)", "train.steps=100", "pruner=none"]
    args += ["hydra.launcher.array_parallelism=1", "resources.gpus=0", "train.step_seconds=0.1", "search.wait=false"]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env={"PYTHONPATH": str(EXAMPLES)})  # sbatch passes the launch's environment to the jobs
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "lightning")

    node = wait_for(lambda: running_past(search, 20), 120, "a running trial with a checkpoint at step >= 20")
    preempt(node, "--exclusive")  # the whole node: its CPU
    wait_for(lambda: all(search.record(t).state.is_finished() for t in search.trial_ids()), 240, "every trial to finish")

    records = list(search.records())
    assert {r.state.value for r in records} == {"completed"}, [(r.trial_id, r.state.value, r.reason) for r in records]
    preempted = preempted_and_resumed(records)
    assert any(a.step % PER_EPOCH for r in preempted for a in r.attempts[:-1]), "no trial was preempted mid-epoch"
    reference = reference_run(TARGET, data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    for r in records:
        expected = reference(r.spec.params, 100, milestones=MILESTONES)
        reported = [(e.data.step, e.data.value) for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        # every milestone each attempt reported, the resumed ones' included, bit-equal to the uninterrupted run's
        assert {s for s, _ in reported} == set(expected) and all(v == expected[s] for s, v in reported), (r.trial_id, reported, expected)
        assert r.metric == expected[100]
        assert r.metric_resume is (MetricResume.EXACT if r in preempted else MetricResume.UNINTERRUPTED), r.trial_id
