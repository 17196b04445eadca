"""Packed trials, the pure parts: the pack size, which trials share a job, a packed job's hours in
reconcile, cancelling one trial of a pack, the controller's limits. The packed paths themselves run
for real in tests/test_launch_local.py (local) and tests/slurm/test_slurm_search.py (SLURM)."""

import pytest

from parcel_hpc.accounting.reconcile import PACK_OVERHEAD, reconcile
from parcel_hpc.budget import BudgetCaps, Rates
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.ledger import Event, TrialSpec, fold
from parcel_hpc.lifecycle.cancel import plan as cancel_plan
from parcel_hpc.scheduler import packing
from parcel_hpc.scheduler.local.runs import local_runs
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slurm import queue as slurm
from parcel_hpc.scheduler.states import JobState

CAPS = BudgetCaps(max_trials=82, gpu_hours_cap=10.0, cost_cap=100.0, rates=Rates(per_gpu_hour=2.0, per_cpu_hour=0.5))


def spec(tid):
    return TrialSpec(tid, int(tid[1:]), {"lr": 0.1}, 1, "sha256:" + tid[1:].rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, {"gpus": 1, "cpus": 1})


def ev(kind, t, **kw):
    defaults = {"executor": "slurm", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": int(t), **defaults, **kw})


def trial(tid, job, start, end, how="completed", restart=0, **ending):
    events = [ev("submitted", 1000, job_id=job), ev("started", start, attempt=1, job_id=job, restart_count=restart)]
    if end is not None:
        events.append(ev("ended", end, attempt=1, how=how, step=82, **({"metric": 0.3} if how == "completed" else {}), **ending))
    return fold(spec(tid), events)


def run(job, attempt, state, start, end, submit=1000):
    return JobRun(job, 77, 77, 3, attempt, state, 0, 0, "n1", "low", "acct", submit, start, end, (end or start) - start, 1, 1, 1)


# --- the pack size -----------------------------------------------------------------------------------


def test_a_fixed_pack_size_is_taken_as_given_and_bad_values_name_the_option():
    assert packing.decide(4, 82, 16, 10, 60, (None, 0)).size == 4
    assert packing.decide("1", 82, 16, 10, 60, (None, 0)).size == 1
    for bad in (0, -1, "two", 1.5, True, validation.MAX_PACK + 1):
        with pytest.raises(UsageError, match="hydra.launcher.pack_size"):
            validation.pack_option(bad)


def test_auto_packs_about_pack_minutes_of_expected_work_but_keeps_every_slot_busy():
    # No history: the time limit is the expected length (10 min a trial, 60 min a job: 6).
    fresh = packing.decide("auto", 82, 2, 10, 60, (None, 0))
    assert fresh.size == 6 and "time limit" in fresh.basis
    # Measured 2 s trials: 1,800 would fill an hour, but 82 trials over 2 slots need 41 a job at most.
    assert packing.decide("auto", 82, 2, 10, 60, (2.0, 82)).size == 41
    # Long trials are never packed; fewer trials than slots are never packed either.
    assert packing.decide("auto", 82, 16, 10, 60, (3600.0, 82)).size == 1
    assert packing.decide("auto", 10, 16, 10, 60, (2.0, 82)).size == 1
    # Without pack_minutes (the local executor's default) the trials split evenly over the slots.
    even = packing.decide("auto", 82, 2, 10, None, (None, 0))
    assert even.size == 41 and "evenly" in even.basis


def test_a_packs_summed_limit_stays_under_the_partitions_max_time():
    assert packing.decide("auto", 82, 2, 10, None, (None, 0), max_job_min=30).size == 3
    cut = packing.decide(6, 82, 2, 10, 60, (None, 0), max_job_min=30)
    assert cut.size == 3 and "MaxTime" in cut.basis
    assert packing.decide("auto", 82, 2, 10, 60, (2.0, 82), max_job_min=None).size == 41
    parts = slurm.parse_partitions(
        "PartitionName=gpu\n   Default=NO MaxTime=1-00:00:00\n\nPartitionName=cpu\n   Default=YES MaxTime=30:00\nPartitionName=big Default=NO MaxTime=UNLIMITED\n"
    )
    assert [(p.name, p.default, p.max_minutes) for p in parts] == [("gpu", False, 1440.0), ("cpu", True, 30.0), ("big", False, None)]


def test_expected_length_needs_enough_finished_attempts():
    done = [trial(f"t{i:04d}", str(i), 100, 110) for i in range(packing.MIN_HISTORY)]
    assert packing.expected_trial_s(done[:-1]) == (None, packing.MIN_HISTORY - 1)
    assert packing.expected_trial_s(done) == (10.0, packing.MIN_HISTORY)
    running = trial("t0099", "99", 100, None)
    assert packing.expected_trial_s([*done, running])[1] == packing.MIN_HISTORY


def test_groups_are_even_and_a_trial_whose_job_died_runs_alone():
    ids = [f"t{i:04d}" for i in range(14)]
    packs = packing.groups(ids, 6)
    assert [len(p) for p in packs] == [5, 5, 4] and sorted(t for p in packs for t in p) == ids
    assert packs[0][:2] == ["t0000", "t0003"] and packs[1][:2] == ["t0001", "t0004"]  # dealt in turn
    never = fold(spec("t0001"), [])
    interrupted = trial("t0002", "5", 100, 110, how="interrupted", cause="preempted")
    died = trial("t0003", "6", 100, None)
    packs = packing.groups(ids, 6, {"t0001": never, "t0002": interrupted, "t0003": died})
    assert packs[-1] == ["t0003"] and sorted(t for p in packs for t in p) == ids
    assert packing.groups([], 6) == []
    assert not never.runs_alone() and not interrupted.runs_alone() and died.runs_alone()
    assert packing.job_time_limit_min(6, 10) == 60


# --- a packed job in reconcile -------------------------------------------------------------------------


def test_a_packed_jobs_hours_go_to_its_trials_and_the_rest_to_the_pack_exactly():
    recs = [trial("t0001", "77_3", 2010, 2030), trial("t0002", "77_3", 2031, 2061, how="pruned")]
    rec = reconcile("s", "m", "test", recs, [run("77_3", 0, JobState.COMPLETED, 2000, 2070)], [], CAPS, now=9999)
    by = {(l.trial_id, l.ledger_how): l for l in rec.attempts}
    assert by[("t0001", "completed")].elapsed_s == 20 and by[("t0002", "pruned")].elapsed_s == 30
    assert by[("", PACK_OVERHEAD)].elapsed_s == 70 - 50
    assert sum(l.elapsed_s for l in rec.attempts) == 70  # adds up to sacct's hours
    assert rec.flags == () and rec.complete
    assert rec.figures["gpu_hours"] == pytest.approx(70 / 3600)
    assert [t.attempts for t in rec.trials] == [1, 1]


def test_a_preempted_pack_charges_the_running_trial_and_finds_every_run():
    # Run 0: t0001 completed, t0002 preempted mid-way; run 1 (the requeue): t0002 resumed and completed.
    t1 = trial("t0001", "77_3", 2010, 2030)
    t2 = fold(
        spec("t0002"),
        [
            ev("submitted", 1000, job_id="77_3"),
            ev("started", 2031, attempt=1, job_id="77_3", restart_count=0),
            ev("ended", 2050, attempt=1, how="interrupted", cause="preempted", step=20),
            ev("started", 2105, attempt=2, job_id="77_3", restart_count=1),
            ev("ended", 2140, attempt=2, how="completed", metric=0.2, step=82),
        ],
    )
    runs = [run("77_3", 0, JobState.PREEMPTED, 2000, 2052), run("77_3", 1, JobState.COMPLETED, 2100, 2141, submit=2060)]
    rec = reconcile("s", "m", "test", [t1, t2], runs, [], CAPS, now=9999)
    assert rec.flags == ()
    assert sum(l.elapsed_s for l in rec.attempts) == 52 + 41
    lines = {(l.trial_id, l.run, l.ledger_attempt): l for l in rec.attempts if l.trial_id}
    assert lines[("t0001", 0, 1)].waste == "" and lines[("t0001", 0, 1)].state == "COMPLETED"  # ended before the preemption
    assert lines[("t0002", 0, 1)].waste == "preemption" and lines[("t0002", 0, 1)].elapsed_s == 19
    assert lines[("t0002", 1, 2)].elapsed_s == 35
    # The ledger missing a run of the pack is still a mismatch.
    lost = reconcile("s", "m", "test", [t1, fold(spec("t0002"), t2_events_first_run())], runs, [], CAPS, now=9999)
    assert [f.kind for f in lost.flags] == ["attempt_mismatch"]


def test_a_pack_is_not_flagged_for_what_only_the_pack_did():
    """A requeued run that finds its trials finished starts none; a pack goes on past a failed trial
    and exits COMPLETED: neither is a disagreement between the ledger and sacct."""
    recs = [trial("t0001", "77_3", 2010, 2030), trial("t0002", "77_3", 2031, 2040, how="failed", cause="exception")]
    runs = [run("77_3", 0, JobState.REQUEUED, 2000, 2045), run("77_3", 1, JobState.COMPLETED, 2100, 2102, submit=2050)]
    rec = reconcile("s", "m", "test", recs, runs, [], CAPS, now=9999)
    assert rec.flags == (), rec.flags
    assert sum(l.elapsed_s for l in rec.attempts) == 45 + 2
    second = [l for l in rec.attempts if l.trial_id == "t0002"][0]
    assert second.queue_wait_s == 0  # it waited for its turn in the job, not in the queue


def test_a_pack_run_again_after_every_trial_finished_is_one_flag_not_a_wait():
    """Slurm 24.11 files the run in which the pack's trials completed PREEMPTED and runs the job once
    more: that run is the trials', the next one overhead (run_after_finish), flagged once, at once."""
    recs = [trial("t0001", "77_3", 2010, 2030), trial("t0002", "77_3", 2031, 2040)]
    runs = [run("77_3", 0, JobState.PREEMPTED, 2000, 2045), run("77_3", 1, JobState.COMPLETED, 2100, 2102, submit=2050)]
    rec = reconcile("s", "m", "test", recs, runs, [], CAPS, now=2110)
    assert [(f.kind, f.trial_id, f.job_id) for f in rec.flags] == [("run_after_finish", "t0001,t0002", "77_3")]
    assert rec.pending == () and rec.complete
    assert {(l.trial_id, l.run): l.waste for l in rec.attempts} == {("t0001", 0): "", ("t0002", 0): "", ("", 0): "", ("", 1): "run_after_finish"}
    assert rec.waste_hours["preemption"] == 0 and rec.waste_hours["run_after_finish"] == pytest.approx(2 / 3600)


def t2_events_first_run():
    return [
        ev("submitted", 1000, job_id="77_3"),
        ev("started", 2031, attempt=1, job_id="77_3"),
        ev("ended", 2050, attempt=1, how="interrupted", cause="preempted"),
    ]


def test_local_packs_are_one_run_from_first_start_to_last_end():
    recs = [trial("t0001", "4242", 2010, 2030), trial("t0002", "4242", 2031, 2061), trial("t0003", "4343", 2000, 2005)]
    runs = local_runs(recs)
    assert sorted((r.job_id, r.start, r.end, r.elapsed_s) for r in runs) == [("4242", 2010, 2061, 51), ("4343", 2000, 2005, 5)]
    rec = reconcile("s", "m", "local executor", recs, runs, [], CAPS)
    assert rec.flags == () and sum(l.elapsed_s for l in rec.attempts) == 56


# --- cancelling one trial of a pack ------------------------------------------------------------------


def test_cancelling_one_trial_of_a_pack_leaves_its_job_to_the_others():
    recs = [trial("t0001", "77_3", 2010, None), fold(spec("t0002"), [ev("submitted", 1000, job_id="77_3")]), trial("t0003", "78_0", 2000, None)]
    one = cancel_plan(recs, ["t0002"])
    assert one.record == ("t0002",) and one.signal == () and one.shared == (("t0002", "77_3"),)
    both = cancel_plan(recs, ["t0001", "t0002"])
    assert both.shared == () and sorted(both.signal) == [("t0001", "77_3"), ("t0002", "77_3")]
    whole = cancel_plan(recs)
    assert whole.shared == () and len(whole.signal) == 3


# --- the controller's limits ---------------------------------------------------------------------------


def test_controller_limits_are_read_from_scontrol_show_config():
    text = "Configuration data as of 2026-12-01T00:00:00\nMaxArraySize            = 101\nMaxJobCount             = 5000\nMaxStepCount = 40000\n"
    assert slurm.parse_config(text) == slurm.ControllerLimits(101, 5000)
    assert slurm.parse_config("MaxArraySize = junk\n") == slurm.DEFAULT_LIMITS
    accounted = slurm.parse_config("ClusterName = parcel\nAccountingStorageType = accounting_storage/slurmdbd\n")
    assert accounted == slurm.ControllerLimits(1001, 10000, "parcel", True)  # associations and their limits apply
