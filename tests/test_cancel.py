"""``parcel-hpc cancel`` on the embedded local executor: real launches, real signals. A cancelled trial
is never retried or resubmitted, its budget hold is settled, and cancelling again changes nothing."""

import json

import pytest

from parcel_hpc.budget import SearchBudget
from parcel_hpc.ledger import Cause, SearchDir, TrialState
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch, wait_for

SLOW = ["pruner=none", "train.step_seconds=0.1", "hydra.launcher.parallelism=2"]  # about 8 s a trial


def start(tmp_path, data_dir, rev: str, n: int, *more: str, slow: tuple[str, ...] = tuple(SLOW)):
    argv = [f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", f"search.n_trials={n}", *slow, *more]
    return start_launch(argv, cwd=tmp_path, data_dir=data_dir)


def running(search: SearchDir, n: int):
    return wait_for(
        lambda: search.path.joinpath("trials").exists() and sum(r.state is TrialState.RUNNING and r.step > 0 for r in search.records()) >= n,
        120,
        f"{n} trials training",
    )


def journal_lines(search: SearchDir) -> list[str]:
    return [f"{p.parent.name}/{p.name}: {line}" for p in sorted(search.trials_dir.glob("*/journal-*.jsonl")) for line in p.read_text().splitlines()]


@pytest.mark.parametrize("dispatch", ["jobs", "slots"])
def test_cancel_stops_a_running_search_for_good(tmp_path, data_dir, dispatch):
    search = SearchDir(tmp_path / "runs" / "stop")
    proc = start(tmp_path, data_dir, "stop", 6, f"hydra.launcher.dispatch={dispatch}")
    running(search, 2)
    res = parcel_hpc(["cancel", str(search.path), "--reason", "wrong space"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    launched = finish(proc, timeout=120)
    assert launched.returncode == 0, launched.stderr[-1000:]
    records = list(search.records())
    assert {r.state for r in records} == {TrialState.CANCELLED}, [(r.trial_id, r.state) for r in records]
    for r in records:
        assert r.cause is Cause.CANCELLED_BY_OWNER and "wrong space" in r.reason and r.metric is None
        assert len(r.attempts) <= 1  # never retried after the signal
        assert SearchBudget(search.path, search.contract()).held(r.trial_id) == []  # every hold settled
    assert sum(len(r.attempts) for r in records) == 2  # the four waiting for a slot never started
    assert not search.queued()  # nothing left for a slot to take
    assert json.loads(search.path.joinpath("cancelled.json").read_text())["reason"] == "wrong space"

    lines = journal_lines(search)
    again = parcel_hpc(["cancel", str(search.path)], cwd=tmp_path)
    assert again.returncode == 0 and "cancelled before" in again.stdout, again.stdout + again.stderr
    assert journal_lines(search) == lines, sorted(set(journal_lines(search)) - set(lines))  # idempotent: nothing new recorded

    relaunch = launch([f"search.root={tmp_path / 'runs'}", "search.revision=stop", "search.n_trials=6", *SLOW], cwd=tmp_path, data_dir=data_dir)
    assert relaunch.returncode == 3 and relaunch.stdout.splitlines()[0] == "reject:cancelled", relaunch.stdout + relaunch.stderr
    resubmit = parcel_hpc(["resubmit", str(search.path)], cwd=tmp_path)
    assert resubmit.returncode == 3 and resubmit.stdout.splitlines()[0] == "reject:cancelled"
    status = json.loads(parcel_hpc(["status", str(search.path), "--json"]).stdout)
    assert status["counts"]["cancelled"] == 6


def test_cancel_of_one_trial_leaves_the_others_running(tmp_path, data_dir):
    search = SearchDir(tmp_path / "runs" / "one")
    # About 33 s a trial: the target must still run when a `cancel` started under a loaded CI machine
    # reaches it (at 8 s a trial the one picked completed first, twice).
    proc = start(tmp_path, data_dir, "one", 3, slow=("pruner=none", "train.step_seconds=0.4", "hydra.launcher.parallelism=2"))
    running(search, 2)
    bad = parcel_hpc(["cancel", str(search.path), "--trial", "t9999"], cwd=tmp_path)
    assert bad.returncode == 2 and "t9999 is not a trial" in bad.stderr and len(bad.stderr.splitlines()) == 1
    assert not search.path.joinpath("cancelled.json").exists()
    assert not list(search.trials_dir.glob("*/journal-cancel-*.jsonl"))  # refused before anything was recorded
    # The running trial with the most steps left, picked just before the cancel: one picked before the
    # refused cancel above once completed first under load (CI), and a finished trial is kept.
    target = min((r for r in search.records() if r.state is TrialState.RUNNING), key=lambda r: r.step).trial_id

    res = parcel_hpc(["cancel", str(search.path), "--trial", target, "--reason", "diverging"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert finish(proc, timeout=180).returncode == 0
    states = {r.trial_id: r.state for r in search.records()}
    assert states.pop(target) is TrialState.CANCELLED
    assert set(states.values()) == {TrialState.COMPLETED}, states
    assert not search.path.joinpath("cancelled.json").exists()
    assert SearchBudget(search.path, search.contract()).held(target) == []
