"""Slots on the embedded local executor (``hydra.launcher.dispatch=slots``): real launches, real
submitit processes. A slot takes its next trial, or makes the sampler's next proposal, when it is
free; every trial stays governed on its own and every proposal replays."""

import json

import pytest

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch
from parcel_hpc.testing.slots import taken_longest_first

SLOTS = "hydra.launcher.dispatch=slots"
TPE = ("sampler=tpe", "sampler.n_startup_trials=4")
MISSING = "trainer.target=parcel_hpc.testing.trainers:MissingParam"


def run(tmp_path, data_dir, rev, *overrides, **kw):
    return launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", SLOTS, *overrides], cwd=tmp_path, data_dir=data_dir, **kw)


def slot_jobs(search: SearchDir) -> set[str]:
    return {s["job_id"] for s in search.slot_records()}


def test_tpe_in_two_slots_proposes_inside_them_and_every_proposal_replays(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "tpe", *TPE, "search.n_trials=16", "hydra.launcher.parallelism=2")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "by the slot itself" in res.stdout and "slots: up to 2 jobs" in res.stdout
    search = SearchDir(tmp_path / "runs" / "tpe")
    records = list(search.records())
    assert len(records) == 16 and all(r.state.is_finished() and len(r.attempts) == 1 and len(r.jobs) == 1 for r in records)
    # Two processes ran all 16 trials: no job a trial, no slot left idle and started again.
    assert len(search.slot_records()) == 2 and {r.jobs[0] for r in records} == slot_jobs(search)
    assert {r.attempts[0].job_id for r in records} == slot_jobs(search)
    assert not search.queued()  # every queue entry was taken and removed
    # Proposed by the slots as they freed: told every earlier proposal, some still running.
    made = [json.loads(search.proposal_path(k).read_text()) for k in search.proposal_numbers()]
    assert [m["index"] for m in made] == list(range(16))
    told = [t["told"] for m in made[4:] for t in m["told"]]
    assert "running" in told and {"complete", "pruned"} & set(told)
    for k, m in enumerate(made):
        assert [t["trial_id"] for t in m["told"]] == [f"t{j:04d}" for j in range(k)]
    replay = parcel_hpc(["proposals", str(search.path), "--replay", "--json"])
    assert replay.returncode == 0 and replay.json()["replayed"] == 16 and replay.json()["first_difference"] is None
    # The admins' view: each slot's job is the search's, nothing unexplained.
    recon = parcel_hpc(["reconcile", str(search.path), "--json"])
    assert recon.returncode == 0, recon.stderr
    assert not [f for c in recon.json()["campaigns"] for f in c["flags"]]


def test_unequal_trials_in_one_slot_run_the_longest_expected_first(tmp_path, data_dir):
    """lr scales each step's sleep (train.step_seconds_param): 0.1 is expected to train 10x longer
    than 0.01. From the journals: once peers had finished, each trial the slot took was expected to run at
    least as long as every trial it left queued, by the same rule the slot applies."""
    res = run(
        tmp_path,
        data_dir,
        "unequal",
        "lr=choice(0.01,0.1)",
        "train.step_seconds=1.0",
        "train.step_seconds_param=lr",
        "pruner=none",
        "train.steps=20",
        "search.n_trials=12",
        "hydra.launcher.parallelism=1",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "unequal")
    records = sorted(search.records(), key=lambda r: r.attempts[0].started)
    assert len(records) == 12 and len(search.slot_records()) == 1
    # Both kinds drawn; how long each ran is the machine's business (timed assertions flake under
    # load: CI once saw 2.05 s against 2 x 1.23 s), so the order is judged by the slot's own rule.
    assert {r.spec.params["lr"] for r in records} == {0.01, 0.1}
    early, reordered = taken_longest_first(search)
    assert not early and reordered  # some trial was taken ahead of an earlier-numbered one


def test_a_trial_whose_limit_fits_no_running_slot_waits_for_a_fresh_one(tmp_path, data_dir):
    """pack_size=1: a slot's job is one trial's time limit, so after its first trial no other fits
    the time it has left. Each trial waits for a fresh slot and none is started only to be cut short."""
    res = run(tmp_path, data_dir, "fit", "search.n_trials=4", "hydra.launcher.pack_size=1", "hydra.launcher.parallelism=2", "pruner=none")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "fit")
    records = list(search.records())
    assert len(records) == 4 and all(r.state.value == "completed" and len(r.attempts) == 1 for r in records)
    assert len(search.slot_records()) == 4 and len({r.jobs[0] for r in records}) == 4  # one trial a slot, four slots
    assert {s["minutes"] for s in search.slot_records()} == {int(search.contract()["resources"]["time_limit_min"])}


def test_two_launchers_share_the_queue_and_each_trial_runs_once(tmp_path, data_dir):
    args = [f"search.root={tmp_path / 'runs'}", "search.revision=two", SLOTS, "search.n_trials=12", "hydra.launcher.parallelism=2"]
    first, second = (start_launch(args, cwd=tmp_path, data_dir=data_dir) for _ in range(2))
    for res in (finish(first), finish(second)):
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "two")
    records = list(search.records())
    assert len(records) == 12 and all(r.state.is_finished() and len(r.attempts) == 1 and len(r.jobs) == 1 for r in records)
    assert {r.jobs[0] for r in records} <= slot_jobs(search)
    taken = [json.loads((search.trial_dir(r.trial_id) / "dispatch-1.taken").read_text()) for r in records]
    assert all(t["job_id"] == r.jobs[0] for t, r in zip(taken, records))


def test_a_trainer_failing_alike_in_slots_holds_the_search_long_before_the_budget(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "broken", *TPE, MISSING, "search.n_trials=40", "hydra.launcher.parallelism=2", "pruner=none", "train.steps=12")
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.splitlines()[0] == "hold:systematic-failure" or "hold:systematic-failure" in res.stdout
    search = SearchDir(tmp_path / "runs" / "broken")
    assert search.hold()["outcome"] == "hold:systematic-failure"
    # Each slot stops after its first 3 attempts failed alike, and no fresh slot proposes while their
    # retries check whether the failure reproduces: 6 drawn at most, never the budget's 40.
    assert len(search.proposal_numbers()) <= 6


@pytest.mark.parametrize(
    "override, needle",
    [
        ("hydra.launcher.dispatch=pilots", "hydra.launcher.dispatch='pilots' must be auto, jobs or slots"),
        ("train.step_seconds_param=hidden", "train.step_seconds_param='hidden' takes a value that is not a positive number"),
        ("train.step_seconds_param=width", "train.step_seconds_param='width' is not a space parameter"),
    ],
)
def test_bad_slot_options_are_one_line_exit_2_and_write_nothing(tmp_path, data_dir, override, needle):
    res = run(tmp_path, data_dir, "bad", override)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()
