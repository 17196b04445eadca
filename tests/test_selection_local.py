"""Selection's guarantees that the whole story does not exercise: a gate that cannot be applied is
refused at launch, trainer code in a selection job is fenced off the final partition, the final
claim is not run twice while its first run may still be alive, and the registry gate accepts a
final result only about this selection's checked artifact."""

import os
import socket
import subprocess
import sys

import pytest

from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.ledger import Executor, JobRole, SearchDir
from parcel_hpc.ledger.selection import SelectionWriter
from parcel_hpc.selection.actions import _why_not_again
from parcel_hpc.selection.gates import Check, Final, GateFacts
from parcel_hpc.selection.jobs import _wait_for_own_submission
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.trainers import PROTECTED_PATH_ENV


def test_a_gate_that_cannot_be_applied_is_refused_before_anything_is_written(tmp_path, data_dir):
    for override, needle in (
        ("selection.gate.min_recall.crushed_corner=1.5", "min_recall.crushed_corner"),
        ("selection.baseline.params.hidden=null", "selection.baseline.params.hidden"),
        ("selection.rerun_tolerance=-1", "selection.rerun_tolerance"),
    ):
        res = launch([f"search.root={tmp_path / 'runs'}", "search.n_trials=1", override], cwd=tmp_path, data_dir=data_dir)
        assert res.returncode == 2, (override, res.stdout, res.stderr)
        assert res.stderr.startswith("error: ") and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert not (tmp_path / "runs").exists()


def test_trainer_code_in_the_rerun_job_is_fenced_off_the_final_partition(tmp_path, data_dir):
    """The trainer reads the final record from its serving path, which only selection calls."""
    final = data_dir / "final-group_r8.json"
    env = {PROTECTED_PATH_ENV: str(final)}
    res = launch(
        [f"search.root={tmp_path}", "search.revision=peek", "search.n_trials=2", "budget.max_trials=2", "pruner=none"]
        + ["trainer.target=parcel_hpc.testing.trainers:OpensProtectedFileWhenServing"],
        cwd=tmp_path,
        data_dir=data_dir,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    search = tmp_path / "peek"
    sel = parcel_hpc(["select", str(search)], cwd=tmp_path, env=env)
    assert sel.returncode == 3 and sel.stdout.splitlines()[0] == str(Outcome.HOLD_INVALID_WINNER), sel.stdout + sel.stderr
    assert "the rerun produced no result" in sel.stdout
    store = SelectionStore(SearchDir(search))
    ended = store.record().job_ended(1, JobRole.RERUN)
    assert not ended.ok and "reject:final_partition" in ended.message and str(final.resolve()) in ended.message
    assert store.result(1, JobRole.RERUN) is None


def _claimed_store(tmp_path, pid: int, host: str | None = None):
    store = SelectionStore(SearchDir(tmp_path))
    store.claim_final({"selection": 1, "trial_id": "t1", "claimed_at": 0.0, "by": "me", "host": host or socket.gethostname(), "pid": pid})
    return store, SelectionWriter(store.dir, "test")


def test_a_claim_whose_process_still_runs_is_not_evaluated_again(tmp_path):
    store, writer = _claimed_store(tmp_path, os.getpid())
    assert "still starting" in _why_not_again(store, store.record(), store.final_claim(), writer)


def test_a_claim_whose_process_died_before_submitting_may_run_again(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    store, writer = _claimed_store(tmp_path, int(gone))
    assert _why_not_again(store, store.record(), store.final_claim(), writer) == ""


def test_a_claim_from_another_host_without_a_job_is_not_guessed_at(tmp_path):
    store, writer = _claimed_store(tmp_path, 1, host="elsewhere-node")
    assert "elsewhere-node" in _why_not_again(store, store.record(), store.final_claim(), writer)


def test_a_running_final_job_is_not_evaluated_again_and_a_failed_one_may_be(tmp_path):
    store, writer = _claimed_store(tmp_path, 1)
    import socket

    from parcel_hpc.ledger import Executor

    writer.job_submitted(1, JobRole.FINAL, str(os.getpid()), Executor("local"), socket.gethostname())
    assert "evaluating it now" in _why_not_again(store, store.record(), store.final_claim(), writer)
    writer.job_ended(1, JobRole.FINAL, str(os.getpid()), False, message="killed")
    assert _why_not_again(store, store.record(), store.final_claim(), writer) == ""


@pytest.mark.parametrize(
    "final, check",
    [
        (None, Check.MISSING),
        ({"selection": 1, "trial_id": "t1", "winner": {"artifact_sha256": "sha256:a"}}, Check.PASSED),
        ({"selection": 2, "trial_id": "t1", "winner": {"artifact_sha256": "sha256:a"}}, Check.FAILED),  # another selection's result
        ({"selection": 1, "trial_id": "t2", "winner": {"artifact_sha256": "sha256:a"}}, Check.FAILED),
        ({"selection": 1, "trial_id": "t1", "winner": {"artifact_sha256": "sha256:b"}}, Check.FAILED),  # not the checked artifact
    ],
)
def test_the_final_check_passes_only_for_this_selections_checked_artifact(final, check):
    assert Final().check(GateFacts(True, final_matches=Final.matches(final, 1, "t1", "sha256:a"))) is check


def test_a_final_job_that_evaluate_final_did_not_submit_never_opens_the_partition(tmp_path):
    """Run by hand, or an orphan whose submitter died before recording it: refused, nothing read."""
    store, writer = _claimed_store(tmp_path, 1)
    writer.job_submitted(1, JobRole.FINAL, "999999", Executor("local"), socket.gethostname())  # another job
    with pytest.raises(GovernanceRefusal) as refused:
        _wait_for_own_submission(store, 1, str(os.getpid()), wait_s=0.3)
    assert str(refused.value.outcome) == "reject:final-holdout-unclaimed"
    writer.job_submitted(1, JobRole.FINAL, str(os.getpid()), Executor("local"), socket.gethostname())
    _wait_for_own_submission(store, 1, str(os.getpid()), wait_s=0.3)  # the newest submission is this one
