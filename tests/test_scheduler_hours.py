"""An attempt's hours come from what the scheduler recorded (pure): a lost attempt counts to its
run's end, a run's hours are sacct's once recorded, the budget journal is restated to them, and
reconcile flags any record the scheduler's own contradicts (issue 44)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from parcel_hpc.accounting.account import SearchPart, over_searches
from parcel_hpc.accounting.account_report import render_table
from parcel_hpc.accounting.listing import SearchSummary
from parcel_hpc.accounting.reconcile import WASTE_OF_CAUSE, FlagKind, Waste, reconcile, waste_of_state
from parcel_hpc.accounting.spend import Hours, attempt_spend, run_spends, search_spend, stale_holds
from parcel_hpc.budget import BudgetCaps, BudgetLedger, Hold, JournalTotals, JournalView, KeyState, Rates, ReservationKey, SearchBudget, attempt_usage
from parcel_hpc.commands.list import render
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Cause, Event, LauncherState, TrialSpec, fold
from parcel_hpc.lifecycle.resolution import filed_runs
from parcel_hpc.scheduler.runs import JobRun, runs_by_job
from parcel_hpc.scheduler.states import JobState

RATES = Rates(per_gpu_hour=2.0, per_cpu_hour=0.05)
RESOURCES = {"gpus": 1, "cpus": 2, "time_limit_min": 60}
BUDGET = {"max_trials": 10, "gpu_hours_cap": 100.0, "cost_cap": 1000.0, "rate_per_gpu_hour": 2.0, "rate_per_cpu_hour": 0.05}
CONTRACT = {"budget": BUDGET, "resources": RESOURCES}
CAPS = BudgetCaps.from_config(BUDGET)


def spec(tid, resources=RESOURCES):
    return TrialSpec(tid, int(tid[1:]), {"lr": 0.1}, 1, "sha256:" + tid[1:].rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, dict(resources))


def ev(kind, t, seq=None, **kw):
    defaults = {"executor": "slurm", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": seq if seq is not None else int(t * 1000), **defaults, **kw})


def run(job, k, start, end, state, gpus=1, cpus=2, elapsed=None):
    base = int(job.split("_")[0])
    return JobRun(
        job, base, base, None, k, state, 0, 0, "n3", "low", "parcel", start - 5, start, end, end - start if elapsed is None else elapsed, gpus, cpus, k + 1
    )


def accounted(r: JobRun, t: float, seq: int) -> Event:
    filed = r.accounted()
    assert filed is not None
    return ev(
        "accounted",
        t,
        seq,
        job_id=filed.job_id,
        run=filed.run,
        start=filed.start,
        end=filed.end,
        elapsed_s=filed.elapsed_s,
        gpus=filed.gpus,
        cpus=filed.cpus,
        node=filed.node,
    )


# --- the case: a node set DOWN 25 s into two packed trials ------------------------------


def node_down_pack():
    """Job 31 runs t0001 then t0002; the node goes down 25 s into t0002 (NODE_FAIL at 1025), the
    requeued run starts at 1260 and its worker notices the loss then."""
    first = [
        ev("submitted", 900, job_id="31"),
        ev("started", 1002, attempt=1, job_id="31", gpus=1, process_started=1001.0),
        ev("ended", 1010, attempt=1, how="completed", metric=0.3),
    ]
    second = [
        ev("submitted", 900, job_id="31"),
        ev("started", 1011, attempt=1, job_id="31", gpus=1, process_started=1001.0),
        ev("resolved", 1262, attempt=1, how="lost", cause="requeued_by_scheduler"),  # the next attempt noticed it: 251 s later
        ev("started", 1262, attempt=2, job_id="31", gpus=1, restart_count=1, process_started=1261.0),
        ev("ended", 1300, attempt=2, how="completed", metric=0.2),
    ]
    runs = [run("31", 0, 1000, 1025, JobState.NODE_FAIL), run("31", 1, 1260, 1302, JobState.COMPLETED)]
    return first, second, runs


def test_a_lost_attempt_counts_to_its_runs_end_once_the_scheduler_recorded_it():
    first, second, runs = node_down_pack()
    provisional = search_spend([fold(spec("t0001"), first), fold(spec("t0002"), second)], None, [], RATES)
    assert provisional.attempts.gpu_hours == pytest.approx((8 + 251 + 38) / 3600, abs=1e-6)  # charged until the loss was noticed
    assert provisional.provisional.gpu_hours == pytest.approx((251 + 2 + 1) / 3600, abs=1e-6)  # the lost attempt, and both runs' start-up and gaps
    assert "provisional" in provisional.line()
    records = [fold(spec(t), evs + [accounted(r, 1400 + i, 9000 + i) for i, r in enumerate(runs)]) for t, evs in (("t0001", first), ("t0002", second))]
    settled = search_spend(records, None, [], RATES)
    assert settled.total.gpu_hours == pytest.approx((25 + 42) / 3600, abs=1e-6)  # sacct's two runs, to the second
    assert settled.total.cpu_hours == pytest.approx(2 * (25 + 42) / 3600, abs=1e-6)
    assert settled.attempts.gpu_hours == pytest.approx((8 + 14 + 38) / 3600, abs=1e-6)  # the lost one 1011 -> 1025, the node failure
    assert settled.provisional == Hours() and "provisional" not in settled.line()
    assert records[1].attempts[0].counted_end() == 1025.0 and records[1].attempts[0].settled_by_scheduler()


def test_a_finished_trial_ends_where_its_last_attempts_hours_end():
    first, second, runs = node_down_pack()
    filed = [accounted(r, 1400 + i, 9000 + i) for i, r in enumerate(runs)]
    assert fold(spec("t0002"), second[:4] + filed).ended_at is None  # still running: no end yet
    done = fold(spec("t0002"), second + filed)
    assert done.ended_at == 1300.0 == max(a.counted_end() or 0.0 for a in done.attempts)
    assert fold(spec("t0001"), first).ended_at == 1010.0


def test_reconcile_settles_what_sacct_filed_and_the_ledger_did_not_record_in_memory():
    first, second, runs = node_down_pack()
    records = [fold(spec("t0001"), first), fold(spec("t0002"), second)]
    rec = reconcile("s1", "m", "sacct", records, runs, [], CAPS, now=5000.0)
    assert rec.unrecorded == (("31", 0), ("31", 1))
    assert rec.spend.total.gpu_hours == pytest.approx(rec.scheduler["gpu_hours"]["used"]) == pytest.approx(67 / 3600, abs=1e-6)
    assert rec.flags == () and rec.waste_hours["node_failure"] == pytest.approx(14 / 3600, abs=1e-6)
    assert [(a.trial_id, a.run, a.elapsed_s) for a in rec.attempts] == [("t0001", 0, 8), ("t0002", 0, 14), ("", 0, 3), ("t0002", 1, 38), ("", 1, 4)]


def test_a_record_the_scheduler_contradicts_is_flagged_run_by_run():
    first, second, runs = node_down_pack()
    recorded = [accounted(r, 1400 + i, 9000 + i) for i, r in enumerate(runs)]
    records = [fold(spec(t), evs + recorded) for t, evs in (("t0001", first), ("t0002", second))]
    assert reconcile("s1", "m", "sacct", records, runs, [], CAPS, now=5000.0).flags == ()  # "no flags" holds here ...
    later = [runs[0], run("31", 1, 1260, 1332, JobState.COMPLETED)]  # ... and fails once sacct says run 1 ran 30 s longer
    (flag,) = reconcile("s1", "m", "sacct", records, later, [], CAPS, now=5000.0).flags
    assert (flag.kind, flag.job_id, flag.trial_id) == (FlagKind.HOURS_MISMATCH, "31", "t0001,t0002")
    assert "run 1 as 0.0117 GPU-h, 0.0233 CPU-h, from 1260 to 1302; sacct says 0.0200 GPU-h, 0.0400 CPU-h, from 1260 to 1332" in flag.detail
    gone = reconcile("s1", "m", "sacct", records, runs[:1], [], CAPS, now=5000.0).flags
    assert [f.kind for f in gone] == [FlagKind.HOURS_MISMATCH, FlagKind.ATTEMPT_MISMATCH] and "sacct has filed no run 1" in gone[0].detail


def test_a_settled_hold_is_restated_to_the_schedulers_figure_and_reconcile_says_so_until_then(tmp_path):
    first, second, runs = node_down_pack()
    budget = SearchBudget(tmp_path, CONTRACT)
    for tid, n in (("t0001", 1), ("t0002", 1), ("t0002", 2)):
        assert budget.reserve(tid, n, RESOURCES).ok
    budget.settle("t0001", 1, RESOURCES, 1002, 1010, 1)
    budget.settle("t0002", 1, RESOURCES, 1011, 1262, 1)  # the next attempt settled it when it noticed the loss
    budget.settle("t0002", 2, RESOURCES, 1262, 1300, 1)
    view = BudgetLedger.read(tmp_path)
    records = [fold(spec("t0001"), first), fold(spec("t0002"), second)]
    assert stale_holds(records, view.holds) == []  # nothing to restate before the scheduler's record
    rec = reconcile("s1", "m", "sacct", records, runs, [], CAPS, view, now=5000.0, search_path="/runs/s1")
    (flag,) = rec.flags
    assert flag.kind is FlagKind.STALE_HOLD and flag.trial_id == "t0002" and "`parcel-hpc sync /runs/s1` restates it" in flag.detail
    recorded = [fold(spec(t), evs + [accounted(r, 1400 + i, 9000 + i) for i, r in enumerate(runs)]) for t, evs in (("t0001", first), ("t0002", second))]
    (stale,) = stale_holds(recorded, view.holds)
    assert stale.settled and stale.charged.gpu_hours == pytest.approx(251 / 3600, abs=1e-6) and stale.used.gpu_hours == pytest.approx(14 / 3600, abs=1e-6)
    entries = lambda: sorted((tmp_path / "budget" / "journal").glob("*.json"))  # noqa: E731
    restated = budget.restate("t0002", 1, stale.used.gpu_hours, stale.used.cpu_hours)
    again = budget.restate("t0002", 1, stale.used.gpu_hours, stale.used.cpu_hours)  # the same figure again writes nothing
    assert again == restated and len(entries()) == 8  # open, 3 reserves, 3 settles, 1 restate
    assert BudgetLedger(tmp_path).verify() == BudgetLedger.read_totals(tmp_path)  # a reader replays the restate as the writer made it
    view = BudgetLedger.read(tmp_path)
    assert stale_holds(recorded, view.holds) == []
    spent = search_spend(recorded, view, [], RATES)
    assert spent.charged.gpu_hours == pytest.approx(spent.attempts.gpu_hours, abs=1e-6) == pytest.approx((8 + 14 + 38) / 3600, abs=1e-6)
    assert view.totals.released_gpu_hours == pytest.approx(3 - (8 + 14 + 38) / 3600, abs=1e-5)  # 3 holds of an hour each, the rest given back
    assert budget.reserve("t0003", 1, RESOURCES).ok
    with pytest.raises(UsageError, match="only a settled attempt is restated"):
        budget.restate("t0003", 1, 0.1, 0.2)


def test_new_runs_are_recorded_once_in_every_trial_of_their_job():
    first, second, runs = node_down_pack()
    records = [fold(spec("t0001"), first), fold(spec("t0002"), second)]
    found = filed_runs(records, runs_by_job(runs + [run("31", 2, 1400, 1400, JobState.PENDING)]))  # a pending run is not filed
    assert [(f.trial_id, f.attempt, f.run.key) for f in found] == [
        ("t0001", 1, ("31", 0)),
        ("t0001", 0, ("31", 1)),
        ("t0002", 1, ("31", 0)),
        ("t0002", 2, ("31", 1)),
    ]
    recorded = [fold(spec(r.trial_id), evs + [accounted(x, 1400 + i, 9000 + i) for i, x in enumerate(runs)]) for r, evs in zip(records, (first, second))]
    assert filed_runs(recorded, runs_by_job(runs)) == []
    assert [f.run.end for f in filed_runs(recorded, runs_by_job([runs[0], run("31", 1, 1260, 1303, JobState.COMPLETED)]))] == [1303, 1303]  # rewritten


# --- one GPU count, one state table ------------------------------------------------------------


def test_an_allocation_above_the_request_counts_the_request_everywhere():
    """Four GPUs allocated for a request of one: the attempt, its job's start-up and the run's record
    all count one (``budget.counted_gpus``)."""
    events = [
        ev("submitted", 0, job_id="5"),
        ev("started", 10, attempt=1, job_id="5", gpus=4, process_started=4.0),
        ev("ended", 370, attempt=1, how="completed", metric=0.2),
    ]
    record = fold(spec("t0001"), events)
    assert attempt_spend(record, record.attempts[0], {}).used.gpu_hours == pytest.approx(360 / 3600, abs=1e-6)
    assert search_spend([record], None, [], RATES).overhead.gpu_hours == pytest.approx(6 / 3600, abs=1e-6)
    filed = run("5", 0, 0, 380, JobState.COMPLETED, gpus=4)
    (settled,) = run_spends([fold(spec("t0001"), events + [accounted(filed, 400, 1)])]).values()
    assert (settled.attempts + settled.rest).gpu_hours == pytest.approx(380 / 3600, abs=1e-6)
    (flag,) = reconcile("s1", "m", "sacct", [record], [filed], [], CAPS).flags  # and reconcile says sacct charged more
    assert flag.kind is FlagKind.HOURS_MISMATCH and "allocated 4 GPUs where the search asked for 1" in flag.detail
    assert attempt_usage(RESOURCES, 0, 3600, 4) == (1.0, 2.0)


def test_every_states_waste_agrees_with_the_lifecycle_cause_of_the_one_table():
    for state in JobState:
        cause = state.cause()
        assert waste_of_state(state) == (WASTE_OF_CAUSE.get(cause) if cause is not None else None), state
    # The two the architecture page names: a node that never booted is a node failure, a deadline a time limit.
    assert (JobState.BOOT_FAIL.cause(), waste_of_state(JobState.BOOT_FAIL)) == (Cause.NODE_FAIL, Waste.NODE_FAILURE)
    assert (JobState.DEADLINE.cause(), waste_of_state(JobState.DEADLINE)) == (Cause.TIMEOUT, Waste.TIMEOUT)
    for state in (JobState.BOOT_FAIL, JobState.DEADLINE, JobState.NODE_FAIL, JobState.PREEMPTED, JobState.TIMEOUT, JobState.REVOKED):
        record = fold(spec("t0001"), [ev("submitted", 0, job_id="8"), ev("started", 10, attempt=1, job_id="8", gpus=1)])
        rec = reconcile("s1", "m", "sacct", [record], [run("8", 0, 5, 65, state)], [], CAPS)
        assert rec.attempts[0].waste is WASTE_OF_CAUSE[state.cause()], state


# --- the hidden-fault property: any interleaving settles to sacct's hours ------------------------

FAULTS = ("complete", "checkpoint", "preempt", "node_failure", "cancel", "requeue")
STATE_OF = {"preempt": JobState.PREEMPTED, "node_failure": JobState.NODE_FAIL, "cancel": JobState.CANCELLED, "requeue": JobState.REQUEUED}


@st.composite
def faulted_jobs(draw):
    """One job of one or two trials (a pack runs them in turn) through up to four runs: in each,
    the trial on turn completes, checkpoints and completes, or meets a fault. A preemption and a
    cancel are said by the worker or not; a node failure and a requeue never are: the loss is
    noticed by the trial's next attempt, by someone later, or never. sacct's record of each run is
    generated alongside, in whole seconds; a requeued pack may find nothing left to run."""
    trials = [f"t{i:04d}" for i in range(draw(st.integers(1, 2)))]
    events = {t: [ev("submitted", 1.0, job_id="40")] for t in trials}
    numbers = dict.fromkeys(trials, 0)
    silent: dict[str, int] = {}  # trial -> its attempt that ended without a word
    runs, clock, done = [], 10, set()
    for k in range(draw(st.integers(1, 4))):
        start = clock + draw(st.integers(0, 60))
        t = start + draw(st.floats(0.05, 5.0))  # the batch script, then the worker process
        began, fault = t, None
        for tid in trials:
            if tid in done:
                continue
            t += draw(st.floats(0.0, 3.0))
            if tid in silent:  # the next attempt says how the last one ended, then starts
                events[tid].append(ev("resolved", t, attempt=silent.pop(tid), how="lost", cause="requeued_by_scheduler"))
            numbers[tid] += 1
            n = numbers[tid]
            events[tid].append(ev("started", t, attempt=n, job_id="40", gpus=1, restart_count=k, process_started=began))
            op = draw(st.sampled_from(FAULTS))
            t += draw(st.floats(1.0, 900.0))
            if op in ("complete", "checkpoint"):
                if op == "checkpoint":
                    events[tid].append(ev("milestone", t - 0.5, attempt=n, step=10, value=0.4))
                events[tid].append(ev("ended", t, attempt=n, how="completed", metric=0.3))
                done.add(tid)
                continue
            said = op in ("preempt", "cancel") and draw(st.booleans())
            if said:
                cause = "preempted" if op == "preempt" else "cancelled"
                events[tid].append(ev("ended", t, attempt=n, how="interrupted", cause=cause))
            else:
                silent[tid] = n
            fault = op
            break
        if fault is None and len(done) == len(trials) and k < 3 and draw(st.booleans()):
            fault = "node_failure"  # the node fails in the job's last moments: its requeued run finds nothing to do
        end = math.floor(t) + draw(st.integers(0, 4))  # sacct's whole seconds: the worker's last word may be a moment after
        runs.append(run("40", k, start, max(start, end), STATE_OF[fault] if fault else JobState.COMPLETED))
        clock = runs[-1].end
        if fault is None:
            break
    for tid, n in silent.items():  # a loss no attempt followed: noticed by a launcher or sync, or never
        if draw(st.booleans()):
            events[tid].append(ev("resolved", clock + draw(st.floats(0, 600)), attempt=n, how="lost", cause="lost"))
    return trials, events, runs


def journal_of(records) -> JournalView:
    """The budget journal as the workers and the resolutions left it: every attempt reserved its
    worst case; a worker that said how its attempt ended settled its own figure, a resolution the
    figure of the end it gave; an attempt no one resolved is still held."""
    holds = {}
    for r in records:
        for a in r.attempts:
            if a.started is None:
                continue
            key = ReservationKey(r.trial_id, a.number)
            if a.ended is None:
                holds[key] = Hold(KeyState.HELD, 1.0, 2.0)
            else:
                holds[key] = Hold(KeyState.SETTLED, 1.0, 2.0, *(round(h, 6) for h in attempt_usage(RESOURCES, a.started, a.ended, a.gpus)))
    return JournalView(JournalTotals(), holds)


@settings(max_examples=300, deadline=None)
@given(faulted_jobs())
def test_property_any_interleaving_of_faults_settles_to_sacct_hours(job):
    trials, events, runs = job
    sacct = Hours(sum(r.gpu_hours for r in runs), sum(r.cpu_hours for r in runs))
    recorded = [fold(spec(t), events[t] + [accounted(r, 9e9, 10**9 + i) for i, r in enumerate(runs)]) for t in trials]
    settled = search_spend(recorded, None, [], RATES)
    assert not settled.total.differs(sacct) and settled.provisional == Hours()
    # The total is sacct's by construction; what the rule decides is the split: every run's attempts
    # fit in it (a lost one ends with its run, never where its loss was noticed), short of at most the
    # second sacct's whole End drops after a worker's last word.
    for part in run_spends(recorded).values():
        assert part.rest.gpu_hours >= -1 / 3600 - 1e-9, part
    # Before anything recorded it, reconcile settles the same figure from sacct's rows in memory.
    plain = [fold(spec(t), events[t]) for t in trials]
    rec = reconcile("s1", "m", "sacct", plain, runs, [], CAPS)
    assert not rec.spend.total.differs(sacct) and rec.spend.total.gpu_hours == pytest.approx(rec.scheduler["gpu_hours"]["used"])
    assert FlagKind.HOURS_MISMATCH not in {f.kind for f in rec.flags}
    # The journal: what stale_holds finds, settled and restated, leaves the caps charging the spend.
    journal = journal_of(plain)
    holds = dict(journal.holds)
    for s in stale_holds(recorded, holds):
        holds[s.key] = Hold(KeyState.SETTLED, 1.0, 2.0, round(s.used.gpu_hours, 6), round(s.used.cpu_hours, 6))
    spent = search_spend(recorded, JournalView(journal.totals, holds), [], RATES)
    assert spent.stale == 0 and spent.held == Hours() and not spent.total.differs(sacct)
    assert spent.charged.gpu_hours == pytest.approx(spent.attempts.gpu_hours, abs=1e-5)
    # What remains to flag is what the ledger itself does not say (a loss no one resolved; a run that
    # ran no trial, or failed after its trial completed, of a single-trial job; a run after every
    # trial of the job finished), never the hours or the budget: on those the ledger and the scheduler agree.
    flags = reconcile("s1", "m", "sacct", recorded, runs, [], CAPS, JournalView(journal.totals, holds)).flags
    allowed = {FlagKind.RUNNING_BUT_ENDED, FlagKind.ATTEMPT_MISMATCH, FlagKind.STATE_MISMATCH, FlagKind.RUN_AFTER_FINISH}
    assert {f.kind for f in flags} <= allowed, flags
    assert len([f for f in flags if f.kind is FlagKind.RUN_AFTER_FINISH]) <= 1, flags  # once per job


# --- one "charged to the caps" figure -----------------------------------------------------------


def test_list_and_reconcile_root_print_one_charged_to_the_caps_figure(tmp_path):
    """``list`` and ``reconcile --root`` show what the caps bind through the one ``Spend.charged_line``:
    the journal's used + held, never sacct's total, which counts start-up the caps never reserved."""
    first, second, runs = node_down_pack()
    records = [fold(spec("t0001"), first), fold(spec("t0002"), second)]
    holds = {ReservationKey("t0001", 1): Hold(KeyState.SETTLED, 1.0, 2.0, 8 / 3600, 16 / 3600), ReservationKey("t0002", 2): Hold(KeyState.HELD, 1.0, 2.0)}
    rec = reconcile("s1", "m", "sacct", records, runs, [], CAPS, JournalView(JournalTotals(), holds), now=5000.0)
    expected = rec.spend.charged_line(CAPS.gpu_hours_cap, CAPS.cost_cap)
    gpu, cpu = 8 / 3600 + 1.0, 16 / 3600 + 2.0  # what settled, and the worst case still held
    assert expected == f"{gpu:.4f} / 100 GPU-h, {RATES.cost(gpu, cpu):.4f} / 1000"
    listed, over = Console(record=True, width=400), Console(record=True, width=400)
    listed.print(render([SearchSummary("/r/s1", "s1", 2, {}, rec.spend, CAPS.gpu_hours_cap, CAPS.cost_cap, LauncherState.ENDED, None)], tmp_path))
    render_table(over_searches("root /r", [SearchPart("/r/s1", "ana", rec)]), over)
    texts = [listed.export_text(), over.export_text()]
    assert all(expected in text for text in texts), texts
    assert f"{rec.scheduler['gpu_hours']['used']:.4g} / 100" not in texts[1]  # sacct's total is not a figure against the caps


def test_a_run_is_recorded_only_once_sacct_filed_it_in_full():
    filed = run("6", 0, 100, 160, JobState.COMPLETED)
    assert filed.accounted() is not None
    for unfiled in (run("6", 0, 100, 160, JobState.RUNNING), run("6", 0, 100, 160, JobState.COMPLETED, gpus=0, cpus=0)):
        assert unfiled.accounted() is None, unfiled  # still running, or ended before its AllocTRES was written
