"""K-fold searches on SLURM (issue 48). A trial preempted in the middle of a fold run: the requeued
attempt scores the folds it finished from their last checkpoints and resumes the interrupted fold
from its own chain, to exactly the fold values and metric of the same trial run uninterrupted. A
K-fold selection's jobs submitted through the SLURM backend, timed for their fold runs."""

import json

from clusters import ON_FAKE

from parcel_hpc.data import read_split
from parcel_hpc.ledger import AttemptEnd, Cause, JobRole, SearchDir
from parcel_hpc.ledger.events import Resumed
from parcel_hpc.scheduler.slurm.sbatch import format_time_limit
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.selection.submit import job_time_limit_min
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import PREEMPTOR, preempt, wait_for
from .examples import submitted_jobs

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


@ON_FAKE
def test_a_k_fold_selection_runs_as_slurm_jobs_timed_for_its_fold_runs_and_releases_the_refit(cluster, tmp_path, data_dir, cluster_guard):
    """select, decide, evaluate-final and release of a K-fold search, their jobs submitted through the
    SLURM backend: the rerun job's limit covers its 2K fold runs and two refits, its result judges
    out-of-fold predictions, and the packet releases the refit."""
    _, names = cluster_guard
    names.append("parcel-kfsel")
    res = launch(
        [SLURM, f"search.root={tmp_path / 'runs'}", "search.revision=kfsel", "split=group_kfold_r1", "search.n_trials=2", "pruner=none"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    path = tmp_path / "runs" / "kfsel"
    k = read_split(data_dir / "split-group_kfold_r1.json").fold_count
    trial_limit = int(SearchDir(path).contract()["resources"]["time_limit_min"])  # K fold runs'

    def cli(*args: str):
        return parcel_hpc([args[0], str(path), *args[1:]], cwd=tmp_path, timeout=900)

    sel = cli("select", "--now", "--reason", "two trials for the SLURM fold test")
    assert sel.returncode in (0, 3) and "Traceback" not in sel.stderr, sel.stdout + sel.stderr
    store = SelectionStore(SearchDir(path))
    (rerun,) = submitted_jobs(store.record(), JobRole.RERUN)
    assert rerun.executor == "slurm"
    script = (store.log_dir(1) / "winner_rerun.sbatch").read_text()
    assert f"#SBATCH --time={format_time_limit(job_time_limit_min(trial_limit, JobRole.RERUN, k))}\n" in script
    assert job_time_limit_min(trial_limit, JobRole.RERUN, k) >= (2 * k + 2) * trial_limit // k
    result = json.loads((path / "selection" / "1" / "rerun" / "result.json").read_text())
    assert result["folds"]["k"] == k and result["slices"]["partition"] == "out-of-fold" and result["refit"]["chain"].endswith("/refit")
    held = sel
    while held.returncode == 3 and held.stdout.splitlines()[0] in ("hold:slice-quality", "hold:performance"):
        held = cli("decide", "--accept", "--by", "Dana Reviewer", "--reason", "accepted for the SLURM fold test")
    assert held.stdout.splitlines()[0] == "evaluate:final-holdout", held.stdout + held.stderr
    assert cli("evaluate-final").returncode == 0
    (final,) = submitted_jobs(store.record(), JobRole.FINAL)
    assert final.executor == "slurm"
    rel = cli("release")
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    packet = json.loads((path / "release" / "packet.json").read_text())
    assert len(packet["folds"]["selected"]) == k
