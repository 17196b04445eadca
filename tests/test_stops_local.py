"""A search that cannot produce a result stops and says why, on the local executor: the first trials
failing alike hold it (``hold:systematic-failure``), a worker that finds the environment drifted from
the contract stops it with the trials not yet run left queued, and a launch with nothing completed
never exits 0 nor points at ``select``. Real launches, real submitit processes."""

import subprocess
import sys

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from parcel_hpc.governance.contract import Contract, load_contract
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import Attempt, AttemptEnd, Cause, EventKind, SearchDir, TrialRecord, TrialSpec, TrialState, fold
from parcel_hpc.ledger.events import Ended, Event, Executor, FailureSignature, Started, Submitted, normalized_message
from parcel_hpc.lifecycle import systematic
from parcel_hpc.lifecycle.actions import Action, RetryPolicy, next_action
from parcel_hpc.propose.specs import in_frozen_form
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.runs import subprocess_env, wait_for, with_suite_cadence

MISSING = "trainer.target=parcel_hpc.testing.trainers:MissingParam"
EACH_OWN = "trainer.target=parcel_hpc.testing.trainers:FailsEachItsOwnWay"
FAST = ("pruner=none", "train.steps=12", "hydra.launcher.parallelism=1")


def run(tmp_path, data_dir, rev, *overrides, **kw):
    return launch(
        [f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *with_suite_cadence([*FAST, *overrides])], cwd=tmp_path, data_dir=data_dir, **kw
    )


def refusal_lines(res) -> tuple[str, str]:
    """The refusal's outcome line (stdout's last) and its explanation (stderr's last line)."""
    out = [l for l in res.stdout.splitlines() if l.strip()]
    err = [l for l in res.stderr.splitlines() if l.strip()]
    return out[-1], err[-1]


# --- the signature and the decision (pure) ---------------------------------------------------------

SPEC = TrialSpec("t0000", 0, {}, 1, "sha256:" + "0" * 64, "sha256:" + "1" * 64, "sha256:" + "2" * 64, {})


def record(tid: str, state: TrialState, t: float, message: str = "KeyError: 'width'", error_type: str = "KeyError", cause=Cause.EXCEPTION) -> TrialRecord:
    spec = TrialSpec(tid, int(tid[1:]), {}, 1, SPEC.config_hash, SPEC.contract_digest, SPEC.image_digest, {})
    if state is TrialState.FAILED:
        a = Attempt(2, started=t - 1, ended=t, how=AttemptEnd.FAILED, cause=cause, message=message, error_type=error_type)
        return TrialRecord(spec, state, attempts=(a,), cause=cause)
    if state is TrialState.COMPLETED:
        return TrialRecord(spec, state, attempts=(Attempt(1, started=t - 1, ended=t, how=AttemptEnd.COMPLETED),), metric=0.5)
    return TrialRecord(spec, state)


def test_messages_of_one_bug_normalize_alike_and_different_bugs_do_not():
    same = [
        "KeyError: 'width'",
        "ValueError: lr=0.0312 out of range at step 17 in /scratch/u1/runs/t0003/ckpt.h5",
        "RuntimeError: CUDA error at 0x7f3a2b10 on job 123456_7",
    ]
    other = [
        "KeyError: 'depth'",
        "ValueError: lr=0.9 out of range at step 3 in /home/x/t0009/ckpt.h5",
        "RuntimeError: CUDA error at 0xdeadbeef on job 99",
    ]
    for a, b in zip(same, other):
        assert normalized_message(a) == normalized_message(b)
    assert len({normalized_message(m) for m in same}) == 3
    sig = FailureSignature.of(Cause.EXCEPTION, "KeyError", "KeyError: 'width'")
    assert sig == FailureSignature(Cause.EXCEPTION, "KeyError", "'…'") and str(sig) == "exception KeyError '…'"
    assert FailureSignature.of(Cause.EXCEPTION, "KeyError", "x") != FailureSignature.of(Cause.EXCEPTION, "IndexError", "x")
    assert FailureSignature.of(Cause.EXCEPTION, "KeyError", "x") != FailureSignature.of(Cause.OUT_OF_MEMORY, "KeyError", "x")


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=5), st.text(alphabet="abcdef ", max_size=20))
@example([9999993], "")  # 7 digits and 8: an 8-digit run is a hex id's shape too
def test_numbers_never_make_two_failures_differ(numbers, words):
    a = f"bad value {' '.join(map(str, numbers))} {words}"
    b = f"bad value {' '.join(str(n + 7) for n in numbers)} {words}"
    assert normalized_message(a) == normalized_message(b)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
@example(0x12345678, 0x1234ABCD)  # an id without a letter is also a run of digits: one mark for both
def test_hex_ids_never_make_two_failures_differ(a, b):
    assert normalized_message(f"object at {a:016x} freed") == normalized_message(f"object at {b:08x} freed")


def test_the_first_k_results_failing_alike_hold_and_nothing_else_does():
    failed = [record(f"t000{i}", TrialState.FAILED, 10.0 + i) for i in range(3)]
    found = systematic.decide(failed, 3)
    assert found is not None and found.trials == ("t0000", "t0001", "t0002") and found.outcome == Outcome.HOLD_SYSTEMATIC_FAILURE
    assert "KeyError: 'width'" in found.text("/s") and "parcel-hpc logs /s t0000" in found.text("/s")
    assert systematic.decide(failed[:2], 3) is None  # not yet k results
    assert systematic.decide(failed, 0) is None  # 0: never
    assert systematic.decide(failed[:1], 1) is not None
    # a completed trial among the first k: the trainer works
    assert systematic.decide([*failed[:2], record("t0005", TrialState.COMPLETED, 11.5)], 3) is None
    # one completed after the first k failed alike: the first k decided it
    assert systematic.decide([*failed, record("t0005", TrialState.COMPLETED, 99.0)], 3) is not None
    # different signatures: no hold, however many fail
    mixed = [*failed[:2], record("t0003", TrialState.FAILED, 12.5, "IndexError: 3", "IndexError")]
    assert systematic.decide(mixed, 3) is None
    # queued, running, rejected and cancelled trials neither count nor break the run
    others = [record("t0007", s, 0.0) for s in (TrialState.QUEUED, TrialState.RUNNING, TrialState.REJECTED, TrialState.CANCELLED)]
    assert systematic.decide([*others, *failed], 3) is not None


def test_a_drift_rejection_leaves_the_trial_queued_and_dispatchable_without_spending_a_retry():
    reject = Outcome.reject("image_digest")
    events = [
        Event(EventKind.SUBMITTED, 1.0, "launch", 1, 0, Submitted("11", Executor("local"), "L1")),
        Event(EventKind.STARTED, 2.0, "a1", 1, 1, Started(job_id="11")),
        Event(EventKind.ENDED, 3.0, "a1", 2, 1, Ended(AttemptEnd.REJECTED, Cause.DRIFT, outcome=reject, reason="reject:image_digest: differs")),
    ]
    rec = fold(SPEC, events)
    assert rec.state is TrialState.QUEUED and rec.awaiting_environment() and rec.attempts[-1].outcome == reject
    assert next_action(rec, dispatches=1, job_alive=False, policy=RetryPolicy(0, 0)).action is Action.RETRY
    with pytest.raises(ValueError):
        Ended(AttemptEnd.FAILED, Cause.DRIFT)  # drift is a rejection, never a failure class
    # the launch side's refusal (the plan is not of this contract) stays final
    final = fold(SPEC, [*events[:2], Event(EventKind.ENDED, 3.0, "a1", 2, 1, Ended(AttemptEnd.REJECTED, outcome=Outcome.reject("contract_digest")))])
    assert final.state is TrialState.REJECTED


# --- real launches ------------------------------------------------------------------------------


def test_trials_failing_alike_stop_the_search_and_logs_shows_why(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "broken", "search.n_trials=6", MISSING)
    assert res.returncode == 3, res.stdout + res.stderr
    line, why = refusal_lines(res)
    assert line == "hold:systematic-failure"
    assert why.startswith("hold:systematic-failure: t0000 t0001 t0002 failed alike: exception KeyError: 'width_multiplier'"), why
    assert "parcel-hpc logs" in why and "search.revision" in why
    assert "parcel-hpc select" not in res.stdout
    search = SearchDir(tmp_path / "runs" / "broken")
    states = {r.trial_id: r.state for r in search.records()}
    assert [states[t] for t in ("t0000", "t0001", "t0002")] == [TrialState.FAILED] * 3
    assert all(states[t] is TrialState.QUEUED and not search.record(t).attempts for t in ("t0003", "t0004", "t0005"))  # never ran
    assert search.hold()["outcome"] == "hold:systematic-failure"
    assert search.launches()[-1]["stopped"] == "hold:systematic-failure"  # the launch record says why it stopped
    # status carries the exception and its message, and the hold
    status = parcel_hpc(["status", str(search.path)])
    assert status.returncode == 0 and "KeyError: 'width_multiplier'" in status.stdout and "hold:systematic-failure" in status.stdout
    # logs: the traceback from the ledger and submitit's output files of the job
    logs = parcel_hpc(["logs", str(search.path)])
    assert logs.returncode == 0, logs.stderr
    assert "t0000 failed: exception KeyError: 'width_multiplier'" in logs.stdout
    assert "Traceback (most recent call last)" in logs.stdout and 'self.width = self.params["width_multiplier"]' in logs.stdout
    job = search.record("t0000").attempts[-1].job_id
    assert f"submitit/local/{job}_0_log.err" in logs.stdout and f"submitit/local/{job}_0_log.out" in logs.stdout
    err_file = (search.path / "submitit" / "local" / f"{job}_0_log.err").read_text().splitlines()
    assert err_file and err_file[-1] in logs.stdout  # the file's own text, not only its name
    first = parcel_hpc(["logs", str(search.path), "t0001", "--attempt", "1"])
    assert first.returncode == 0 and "t0001 attempt 1 of 2: failed exception" in first.stdout
    for bad in (["t9999"], ["t0001", "--attempt", "7"], ["--attempt", "1"]):
        refused = parcel_hpc(["logs", str(search.path), *bad])
        lines = [l for l in refused.stderr.splitlines() if l.strip()]
        assert refused.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (bad, refused.stderr)
    # a relaunch of the same contract is held the same, before it dispatches anything
    again = run(tmp_path, data_dir, "broken", "search.n_trials=6", MISSING)
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "hold:systematic-failure", again.stdout + again.stderr
    assert sum(len(r.attempts) for r in search.records()) == 6  # nothing more ran


def test_trials_failing_each_their_own_way_end_without_a_result_and_exit_3(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "each", "search.n_trials=3", EACH_OWN)
    assert res.returncode == 3, res.stdout + res.stderr
    line, why = refusal_lines(res)
    assert line == "hold:no-result" and "failed=3" in why and "parcel-hpc logs" in why, why
    assert "parcel-hpc select" not in res.stdout and "parcel-hpc logs" in res.stdout
    assert [r.state for r in SearchDir(tmp_path / "runs" / "each").records()] == [TrialState.FAILED] * 3
    assert SearchDir(tmp_path / "runs" / "each").hold() is None  # not alike: no hold, nothing held for good


def test_a_search_with_a_completed_trial_still_points_at_select(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "fine", "search.n_trials=1")
    assert res.returncode == 0, res.stderr
    assert "parcel-hpc select" in res.stdout
    # a search frozen before budget.systematic_failures existed is the same search at the default:
    # a relaunch continues it, and it stops at the value it then had
    contract = load_contract(tmp_path / "runs" / "fine")
    assert contract["budget"]["systematic_failures"] == systematic.BEFORE_PINNED
    legacy = Contract({**contract.fields, "budget": {k: v for k, v in contract["budget"].items() if k != "systematic_failures"}})
    assert in_frozen_form(contract, legacy).digest == legacy.digest and systematic.threshold(legacy["budget"]) == 3
    other = Contract({**contract.fields, "budget": {**contract["budget"], "systematic_failures": 5}})
    assert in_frozen_form(other, legacy) is other  # another value is another contract: refused as before


def test_drift_mid_search_stops_it_and_a_relaunch_in_the_matching_environment_runs_the_rest(tmp_path, data_dir):
    archive = tmp_path / "image.sif"
    archive.write_bytes(b"image one")
    slow = ("image=archive", f"image.path={archive}", "train.step_seconds=0.05", "train.steps=20", "pruner.milestones=[10,20]")
    launcher = _start(tmp_path, data_dir, "drift", "search.n_trials=4", *slow)
    search = SearchDir(tmp_path / "runs" / "drift")
    # the first trial passes its worker's check and trains; then the image changes under the search
    wait_for(lambda: (search.path / "trials" / "t0000" / "spec.json").exists() and _admitted(search, "t0000"), 120, "t0000 to be admitted by its worker")
    archive.write_bytes(b"image two")
    out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 3, out + err
    lines = [l for l in out.splitlines() if l.strip()]
    assert lines[-1] == "reject:image_digest", out
    assert "parcel-hpc select" not in out and "relaunch the same command" in out  # trials are left: not select yet
    why = [l for l in err.splitlines() if l.strip()][-1]
    assert why.startswith("reject:image_digest: t0001's worker: reject:image_digest: this worker sees image_digest"), why
    assert "restore the environment and relaunch the same command to run the 3 queued trials" in why
    assert search.launches()[-1]["stopped"] == "reject:image_digest" and search.hold() is None  # a stop, not a hold
    records = {r.trial_id: r for r in search.records()}
    assert records["t0000"].state is TrialState.COMPLETED  # it started under the contract and ran on
    assert records["t0001"].state is TrialState.QUEUED and records["t0001"].attempts[-1].how is AttemptEnd.REJECTED
    assert all(records[t].state is TrialState.QUEUED and not records[t].attempts for t in ("t0002", "t0003"))  # never ran
    # relaunched while it still differs: refused at the door, nothing dispatched
    refused = run(tmp_path, data_dir, "drift", "search.n_trials=4", *slow)
    assert refused.returncode == 3 and refused.stdout.splitlines()[0] == "reject:image_digest"
    # restored: the same command runs the queued trials to completion
    archive.write_bytes(b"image one")
    again = run(tmp_path, data_dir, "drift", "search.n_trials=4", *slow)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r.state for r in search.records()] == [TrialState.COMPLETED] * 4
    assert "parcel-hpc select" in again.stdout


def _admitted(search: SearchDir, trial_id: str) -> bool:
    return any(e.kind is EventKind.ADMITTED for e in search.events(trial_id))


def _start(tmp_path, data_dir, rev, *overrides) -> subprocess.Popen:
    """A launch in the background (the test changes the environment while it runs)."""
    argv = [
        sys.executable,
        "-m",
        "parcel_hpc.launch",
        "-m",
        f"search.root={tmp_path / 'runs'}",
        f"search.revision={rev}",
        *with_suite_cadence([*FAST, *overrides]),
    ]
    return subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
