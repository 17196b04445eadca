"""Slots, the pure parts: which queued trial a slot takes, how long a trial is expected to run, the
dispatch option. The slots themselves run for real in tests/test_slots_local.py (local) and
tests/slurm/test_slurm_slots.py (SLURM)."""

import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.accounting.reconcile import reconcile
from parcel_hpc.budget import BudgetCaps, Rates
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.launch.slot import left_here
from parcel_hpc.ledger import Event, TrialSpec, fold
from parcel_hpc.scheduler import slots
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slots import Peer, Queued
from parcel_hpc.scheduler.states import JobState


def spec(tid, **params):
    return TrialSpec(tid, int(tid[1:]), params or {"lr": 0.1}, 1, "sha256:" + tid[1:].rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, {})


def ev(kind, t, **kw):
    defaults = {"executor": "local", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": int(t), **defaults, **kw})


def record(tid, *events, **params):
    return fold(spec(tid, **params), list(events))


def test_a_trial_is_expected_to_take_its_time_limit_until_peers_have_finished():
    assert slots.expected_s({"lr": 0.1}, [], 600.0) == 600.0
    assert slots.expected_s({"lr": 0.1}, [Peer({"lr": 0.1}, 5.0)] * (slots.MIN_PEERS - 1), 600.0) == 600.0


def test_the_nearest_peers_on_a_log_scale_decide_and_the_limit_caps_them():
    known = [Peer({"lr": 0.001, "hidden": 16}, 100.0), Peer({"lr": 0.002, "hidden": 16}, 120.0), Peer({"lr": 0.1, "hidden": 16}, 10.0)]
    # lr 0.0015 is nearest 0.001 and 0.002 on a log scale (a linear one would call 0.1 far too, but so would it be)
    assert slots.expected_s({"lr": 0.0015, "hidden": 16}, known, 600.0) in (100.0, 120.0)
    assert slots.expected_s({"lr": 0.09, "hidden": 16}, known, 600.0) == 10.0
    assert slots.expected_s({"lr": 0.0015, "hidden": 16}, known, 50.0) == 50.0  # never beyond the time limit
    # a category apart counts as a whole unit: hidden=64 with lr near 0.1 is still nearest the 0.1 peer
    assert slots.expected_s({"lr": 0.1, "hidden": 64}, known, 600.0) == 10.0
    many = [Peer({"lr": 0.01 * (i + 1)}, float(i)) for i in range(30)]
    assert slots.expected_s({"lr": 0.15}, many, 600.0) == pytest.approx(14.0)  # the median of its 5 nearest (12..16)


def test_the_longest_expected_trial_whose_limit_fits_is_taken_ties_in_trial_order():
    a, b, c = Queued("t0002", 1), Queued("t0001", 1), Queued("t0003", 2)
    C = slots.Candidate
    assert slots.choose([C(a, 30.0, 60.0), C(b, 30.0, 60.0), C(c, 10.0, 60.0)], 100.0, first=False) == b
    assert slots.choose([C(a, 50.0, 300.0), C(b, 30.0, 60.0), C(c, 10.0, 60.0)], 100.0, first=False) == b  # a's limit does not fit 100 s
    assert slots.choose([C(a, 5.0, 300.0), C(b, 5.0, 200.0)], 100.0, first=False) is None  # the slot ends: a fresh one takes them
    assert slots.choose([C(a, 5.0, 300.0), C(b, 4.0, 200.0)], 100.0, first=True) == a  # a fresh slot's first trial, whatever its limit
    assert slots.choose([], 100.0, first=True) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 1000)), max_size=12), st.floats(0, 1000), st.booleans())
def test_property_what_is_chosen_fits_and_nothing_fitting_is_expected_longer(trials, remaining, first):
    candidates = [slots.Candidate(Queued(f"t{i:04d}", 1), expected, limit) for i, (expected, limit) in enumerate(trials)]
    pick = slots.choose(candidates, remaining, first)
    fitting = [c for c in candidates if first or c.limit_s <= remaining]
    if not fitting:
        assert pick is None
        return
    chosen = next(c for c in candidates if c.queued == pick)
    assert chosen in fitting and chosen.expected_s == max(c.expected_s for c in fitting)
    assert pick.trial_id == min(c.queued.trial_id for c in fitting if c.expected_s == chosen.expected_s)  # ties: the first trial


def test_a_slot_takes_only_the_latest_dispatch_of_a_trial_no_one_took():
    queued = record("t0001")
    assert slots.free_to_take(queued, 1, taken=False, withdrawn=False, latest=1)
    assert not slots.free_to_take(queued, 1, taken=True, withdrawn=False, latest=1)  # another slot took it
    assert not slots.free_to_take(queued, 1, taken=False, withdrawn=True, latest=1)  # its launcher stopped
    assert not slots.free_to_take(queued, 1, taken=False, withdrawn=False, latest=2)  # given up for a newer dispatch
    submitted = record("t0001", ev("submitted", 1, job_id="7"))
    assert not slots.free_to_take(submitted, 1, taken=False, withdrawn=False, latest=1)  # it has a job already
    done = record(
        "t0001", ev("submitted", 1, job_id="7"), ev("started", 2, attempt=1, job_id="7"), ev("ended", 3, attempt=1, how="completed", step=82, metric=0.4)
    )
    assert not slots.free_to_take(done, 2, taken=False, withdrawn=False, latest=2)  # finished
    interrupted = record(
        "t0001",
        ev("submitted", 1, job_id="7"),
        ev("started", 2, attempt=1, job_id="7"),
        ev("ended", 3, attempt=1, how="interrupted", cause="preempted", step=10),
    )
    assert slots.free_to_take(interrupted, 2, taken=False, withdrawn=False, latest=2)  # resumes in any slot
    lost = record("t0001", ev("submitted", 1, job_id="7"), ev("started", 2, attempt=1, job_id="7"), ev("ended", 3, attempt=1, how="lost", cause="lost"))
    assert not slots.free_to_take(lost, 2, taken=False, withdrawn=False, latest=2)  # it runs alone: a job of its own


def test_peers_are_attempts_that_ran_to_a_result():
    done = record(
        "t0001", ev("submitted", 1, job_id="7"), ev("started", 2, attempt=1, job_id="7"), ev("ended", 12, attempt=1, how="completed", step=82, metric=0.4)
    )
    failed = record(
        "t0002", ev("submitted", 1, job_id="7"), ev("started", 2, attempt=1, job_id="7"), ev("ended", 3, attempt=1, how="failed", cause="exception")
    )
    assert slots.peers([done, failed, record("t0003")]) == [Peer({"lr": 0.1}, 10.0)]


def test_the_dispatch_option_and_a_slots_time_limit():
    assert validation.dispatch_option(None) is validation.Dispatch.JOBS  # a launch recorded before slots
    assert validation.dispatch_option("Slots") is validation.Dispatch.SLOTS
    assert [validation.dispatch_option("auto").slotted(learns) for learns in (True, False)] == [True, False]
    assert validation.dispatch_option("slots").slotted(False) and not validation.dispatch_option("jobs").slotted(True)
    with pytest.raises(UsageError, match=r"hydra.launcher.dispatch='pilots' must be auto, jobs or slots"):
        validation.dispatch_option("pilots")
    assert slots.slot_minutes(6, 10) == 60 and slots.slot_minutes(0, 10) == 10  # at least one trial's limit


def test_a_slot_that_took_no_trial_is_a_line_in_reconcile_never_an_orphan():
    caps = BudgetCaps(max_trials=82, gpu_hours_cap=10.0, cost_cap=100.0, rates=Rates(per_gpu_hour=2.0, per_cpu_hour=0.5))
    done = record(
        "t0001",
        ev("submitted", 1, job_id="77_0"),
        ev("started", 2000, attempt=1, job_id="77_0"),
        ev("ended", 2030, attempt=1, how="completed", step=82, metric=0.4),
    )
    # The slots were granted what the trials' spec asks (no GPU): more would be an HOURS_MISMATCH flag.
    ran = JobRun("77_0", 77, 77, 0, 0, JobState.COMPLETED, 0, 0, "n1", "low", "acct", 1000, 1990, 2040, 50, 0, 1, 1)
    idle = JobRun("77_1", 77, 77, 1, 0, JobState.COMPLETED, 0, 0, "n2", "low", "acct", 1000, 1990, 1995, 5, 0, 1, 1)
    stray = JobRun("88", 88, 88, None, 0, JobState.COMPLETED, 0, 0, "n3", "low", "acct", 1000, 1990, 1995, 5, 1, 1, 1)
    out = reconcile("s", "m", "test", [done], [ran], [idle, stray], caps, now=9999, slot_jobs={"77_0", "77_1"})
    assert [(f.kind, f.job_id) for f in out.all_flags()] == [("orphan", "88")]  # the idle slot is the search's own
    assert {"77_1", "88"} <= set(out.lines().filter(pc.equal(out.lines().column("trial_id"), "")).column("job_id").to_pylist())


def test_a_requeued_slot_runs_first_only_the_trial_left_there():
    def ran(how, **ending):
        return record("t0001", ev("submitted", 1, job_id="7_0"), ev("started", 2, attempt=1, job_id="7_0"), ev("ended", 3, attempt=1, how=how, **ending))

    assert left_here(ran("interrupted", cause="preempted", step=10), "7_0")
    assert not left_here(ran("interrupted", cause="preempted", step=10), "7_1")  # another job's
    assert not left_here(ran("failed", cause="exception"), "7_0")  # its failure check runs alone
    assert not left_here(ran("lost", cause="lost"), "7_0")  # died without saying how: alone too
    assert left_here(record("t0001", ev("submitted", 1, job_id="7_0")), "7_0")  # taken here, the warning came before it started


def test_a_whole_cancel_ends_only_the_slots_running_none_of_its_trials():
    from parcel_hpc.lifecycle.cancel import idle_slots

    slot_records = [{"job_id": "7_0"}, {"job_id": "7_1"}, {"job_id": ""}, {"job_id": "7_1"}, {"job_id": "9"}]
    # 7_0 runs t0001 (ended through its trial); 7_1 is pending twice recorded; 9 waits between trials
    assert idle_slots(slot_records, [("t0001", "7_0")]) == ("7_1", "9")
    assert idle_slots(slot_records, [("t0001", "7_0"), ("t0002", "7_1"), ("t0003", "9")]) == ()
