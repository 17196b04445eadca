"""A K-fold trial preempted on SLURM in the middle of a fold run (issue 48): the requeued attempt
scores the folds it finished from their last checkpoints and resumes the interrupted fold from its
own chain, to exactly the fold values and metric of the same trial run uninterrupted."""

from clusters import ON_FAKE

from parcel_hpc.ledger import AttemptEnd, Cause, SearchDir
from parcel_hpc.ledger.events import Resumed
from parcel_hpc.testing import launch

from .cluster import PREEMPTOR, preempt, wait_for

SLURM = "hydra/launcher=submitit_slurm"
FOLDS = ["split=group_kfold_r1", "search.n_trials=1", "pruner=none"]


@ON_FAKE
def test_a_fold_preempted_mid_run_resumes_its_own_chain_to_the_uninterrupted_values(cluster, tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-folds", PREEMPTOR]
    runs = tmp_path / "runs"
    res = launch(
        [SLURM, f"search.root={runs}", "search.revision=folds", *FOLDS, "search.wait=false", "resources.gpus=4", "train.step_seconds=0.1"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    search = SearchDir(runs / "folds")

    def in_fold_2():
        if not any((runs / "folds" / "checkpoints" / "t0000" / "fold-2").glob("ckpt-*.h5")):
            return None
        started = [e.data for e in search.events("t0000") if e.kind.value == "started"]
        return started[-1].node if started else None

    preempt(wait_for(in_fold_2, 240, "a first checkpoint of fold 2"))  # a high-priority job wants the node's GPUs
    record = wait_for(lambda: search.record("t0000").state.is_finished() and search.record("t0000"), 300, "the trial to finish")
    assert record.state.value == "completed", (record.state, record.reason)
    first, last = record.attempts[0], record.attempts[-1]
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.PREEMPTED) and 0 < first.step < 82
    assert last.how is AttemptEnd.COMPLETED and last.restart_count >= 1
    resumed = {e.data.fold: e.data.step for e in search.events("t0000") if isinstance(e.data, Resumed) and e.attempt == last.number}
    assert resumed == {0: 82, 1: 82, 2: first.step}

    ref = launch([f"search.root={runs}", "search.revision=folds-ref", *FOLDS], cwd=tmp_path, data_dir=data_dir)  # the local executor
    assert ref.returncode == 0, ref.stderr[-2000:]
    reference = SearchDir(runs / "folds-ref").record("t0000")
    assert record.folds == reference.folds and record.metric == reference.metric
    assert record.folds is not None and len(record.folds.values) == 5
