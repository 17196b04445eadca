"""The PyTorch CNN (examples/parcel_cnn) as a SLURM array search on the dev cluster: 12 trials under
its own successive halving, trials preempted by a high-priority job requeued and resumed from their
checkpoints, every completed trial ending bit-equal to an uninterrupted run in this process, and
each pruning decision backed by the peers it names. On the CPU (resources.gpus=0): the dev
cluster's GPUs are gres entries with no device behind them, which torch rightly refuses."""

import pytest

torch = pytest.importorskip("torch")  # the [torch] extra; scripts/test.sh installs it

from reference import CNN_MILESTONES, CNN_STEPS, EXAMPLES, reference_run  # noqa: E402

from parcel_hpc.ledger import SearchDir  # noqa: E402
from parcel_hpc.testing import launch  # noqa: E402

from .cluster import PREEMPTOR, preempt, wait_for  # noqa: E402
from .examples import preempted_and_resumed, running_past  # noqa: E402

pytestmark = pytest.mark.slurm


def test_a_cnn_array_search_prunes_and_resumes_after_preemption_with_exact_metrics(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-cnn", PREEMPTOR]
    cnn = ["trainer.target=parcel_cnn:ParcelCNN", f"hydra.searchpath=[file://{EXAMPLES / 'parcel_cnn' / 'conf'}]", "space=cnn_r1"]
    cnn += ["selection/baseline=cnn_approved", "pruner=asha_cnn_r1", f"train.steps={CNN_STEPS}", CNN_MILESTONES]
    cnn += ["search.seed=4", "width=choice(8,16)"]
    # train.step_seconds: about 14 s a trial, so the preemption below lands while trials run.
    res = launch(
        ["hydra/launcher=submitit_slurm", f"search.root={tmp_path / 'runs'}", "search.revision=cnn", *cnn, "search.n_trials=12"]
        + ["hydra.launcher.array_parallelism=6", "resources.gpus=0", "train.step_seconds=0.12", "search.wait=false"],
        cwd=tmp_path,
        data_dir=data_dir,
        env={"PYTHONPATH": str(EXAMPLES)},  # sbatch passes the launch's environment to the jobs
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "cnn")

    node = wait_for(lambda: running_past(search, 50), 240, "a running trial with a checkpoint at step >= 50")
    # A high-priority job wanting the whole node preempts every trial on it.
    preempt(node, "--exclusive")
    wait_for(lambda: all(search.record(t).state.is_finished() for t in search.trial_ids()), 600, "every trial to finish")

    records = list(search.records())
    states = [r.state.value for r in records]
    assert len(records) == 12 and set(states) <= {"pruned", "completed"} and "completed" in states, states
    preempted_and_resumed(records)
    reference = reference_run("parcel_cnn:ParcelCNN", data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    for r in records:
        if r.state.value == "completed":
            assert r.metric == reference(r.spec.params, CNN_STEPS), r.trial_id
        else:  # pruned: ties never prune, so some peer at that milestone was strictly better
            ended = [e.data for e in search.events(r.trial_id) if e.kind.value == "ended" and e.data.how.value == "pruned"][-1]
            peers = [
                e for t in search.trial_ids() if t != r.trial_id for e in search.events(t) if e.kind.value == "milestone" and e.data.step == ended.milestone
            ]
            assert sum(p.data.value < ended.value for p in peers) >= 1, r.trial_id
