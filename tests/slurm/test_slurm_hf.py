"""An unchanged Hugging Face ``Trainer`` (examples/parcel_hf) on the dev SLURM cluster (issue 46): its
trial preempted mid-epoch by a high-priority job, requeued, and resumed by the Trainer itself from the
checkpoint the run took, every milestone value bit-equal to an uninterrupted run in this process."""

import math

import pytest

pytest.importorskip("transformers")  # the [hf] extra; scripts/test.sh installs it

from reference import EXAMPLES, reference_run  # noqa: E402

from parcel_hpc.data import read_split  # noqa: E402
from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.testing import launch  # noqa: E402
from parcel_hpc.trainer import load_training_data  # noqa: E402

from .cluster import PREEMPTOR, preempt, wait_for  # noqa: E402
from .examples import preempted_and_resumed, running_past  # noqa: E402

pytestmark = pytest.mark.slurm

STEPS, MILESTONES, BATCH = 40, (20, 40), 32


def test_an_hf_trainer_preempted_mid_epoch_resumes_with_bit_equal_milestones(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-hf", PREEMPTOR]
    space = ["~space.params.hidden", "~space.params.l2", f"batch_size=choice({BATCH})", "lr=choice(0.03)", f"train.steps={STEPS}"]
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=hf", "trainer.target=parcel_hf:train", *space]
        + ["search.n_trials=1", f"pruner.milestones=[{MILESTONES[0]}]", "pruner.min_peers=1"]  # alone: never pruned
        + ["resources.gpus=0", "train.step_seconds=0.3", "search.wait=false"],
        cwd=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": str(EXAMPLES)},  # sbatch passes the launch's environment to the jobs
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "hf")
    node = wait_for(lambda: running_past(search, 10), 120, "the trial running with a checkpoint at step >= 10")
    preempt(node, "--exclusive")  # the job is signalled, saves at its next step, is requeued
    rec = wait_for(lambda: search.record("t0000").state.is_finished() and search.record("t0000"), 180, "the trial to finish")
    assert rec.state.value == "completed", (rec.state, rec.reason)
    (preempted,) = preempted_and_resumed([rec])  # resumed at exactly the step the preempted attempt saved
    per_epoch = math.ceil(
        len(load_training_data(data_dir / "parcels.h5", read_split(data_dir / "split-group_r8.json"), {"revision": "stats-r1", "pool": 4}).train) / BATCH
    )
    assert preempted.attempts[0].step % per_epoch != 0  # mid-epoch: the resumed Trainer skips the epoch's trained batches itself
    milestones = {e.data.step: e.data.value for e in search.events("t0000") if e.kind.value == "milestone"}
    uninterrupted = reference_run("parcel_hf:train", data_dir / "parcels.h5", data_dir / "split-group_r8.json")(
        rec.spec.params, STEPS, milestones=MILESTONES[:1]
    )
    assert milestones == uninterrupted and set(milestones) == set(MILESTONES)
