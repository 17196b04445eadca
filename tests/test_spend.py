"""A search's one spend (pure): the breakdown adds up, every ending settles, a lost one too."""

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.accounting.reconcile import FlagKind, reconcile
from parcel_hpc.accounting.spend import Hours, JobHours, Spend, search_spend, stale_holds
from parcel_hpc.budget import BudgetCaps, BudgetLedger, Hold, JournalTotals, JournalView, KeyState, Rates, ReservationKey, SearchBudget
from parcel_hpc.ledger import AttemptEnd, Event, TrialSpec, fold
from parcel_hpc.worker.jobenv import process_started

RATES = Rates(per_gpu_hour=2.0, per_cpu_hour=0.05)
RESOURCES = {"gpus": 1, "cpus": 2, "time_limit_min": 10}
CONTRACT = {
    "budget": {"max_trials": 10, "gpu_hours_cap": 100.0, "cost_cap": 1000.0, "rate_per_gpu_hour": 2.0, "rate_per_cpu_hour": 0.05},
    "resources": RESOURCES,
}
CAPS = BudgetCaps.from_config(CONTRACT["budget"])

# What each ending needs to be a valid event (its cause, outcome or metric).
ENDINGS = {
    AttemptEnd.COMPLETED: {"metric": 0.3},
    AttemptEnd.PRUNED: {},
    AttemptEnd.FAILED: {"cause": "exception"},
    AttemptEnd.INTERRUPTED: {"cause": "preempted"},
    AttemptEnd.LOST: {"cause": "requeued_by_scheduler"},
    AttemptEnd.REJECTED: {"outcome": "reject:image_digest"},
    AttemptEnd.QUARANTINED: {"cause": "checkpoint_collision"},
    AttemptEnd.BUDGET_EXHAUSTED: {"outcome": "hold:budget"},
}


def spec(tid, resources=RESOURCES):
    return TrialSpec(tid, int(tid[1:]), {"lr": 0.1}, 1, "sha256:" + tid[1:].rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, dict(resources))


def ev(kind, t, **kw):
    defaults = {"executor": "slurm", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": int(t * 1000), **defaults, **kw})


def ended(tid, how, start=0.0, end=1800.0, kind="ended", job="7"):
    events = [ev("submitted", start, job_id=job), ev("started", start + 1, attempt=1, job_id=job, gpus=1)]
    return fold(spec(tid), events + [ev(kind, end, attempt=1, how=how.value, **ENDINGS[how])])


def held(g=1 / 6, c=2 / 6):
    return Hold(KeyState.HELD, g, c)


def test_every_ending_leaves_a_stale_hold_to_settle_with_the_hours_the_ledger_saw():
    for how in AttemptEnd:
        record = ended("t0001", how)
        (found,) = stale_holds([record], {ReservationKey("t0001", 1): held()})
        assert (found.key, found.settled, found.charged) == (ReservationKey("t0001", 1), False, Hours(1 / 6, 2 / 6)), how
        assert found.used == Hours(round(1 / 6, 6), round(2 / 6, 6)), how  # 1 s to 1800 s, never past the 10-minute limit (micro-hours)


def test_a_lost_attempt_resolved_by_the_next_one_settles_and_a_running_one_does_not():
    events = [ev("submitted", 0, job_id="7"), ev("started", 1, attempt=1, job_id="7", gpus=1)]
    running = fold(spec("t0001"), events)
    assert stale_holds([running], {ReservationKey("t0001", 1): held()}) == []
    lost = fold(spec("t0001"), events + [ev("resolved", 301, attempt=1, how="lost", cause="requeued_by_scheduler")])
    (found,) = stale_holds([lost], {ReservationKey("t0001", 1): held()})
    assert found.used.gpu_hours == pytest.approx(300 / 3600, abs=1e-6)
    settled = {ReservationKey("t0001", 1): Hold(KeyState.SETTLED, 1 / 6, 2 / 6, 0.1, 0.2)}
    assert stale_holds([lost], settled) == []  # settled once: nothing left
    never_started = fold(spec("t0001"), [ev("submitted", 0, job_id="7"), ev("resolved", 5, attempt=1, how="lost", cause="lost")])
    assert stale_holds([never_started], {ReservationKey("t0001", 1): held()}) == []  # no start: hours unknown, kept
    gone = stale_holds([running], {ReservationKey("t0001", 1): held()}, gone_at={"t0001": 60.0})
    assert [h.used.gpu_hours for h in gone] == [pytest.approx(59 / 3600, abs=1e-6)]  # cancel: its job is gone


def test_settling_is_idempotent_across_processes_and_capped_at_the_time_limit(tmp_path):
    a, b = SearchBudget(tmp_path, CONTRACT), SearchBudget(tmp_path, CONTRACT)
    resources = CONTRACT["resources"]  # the trial's own: the contract's, in a search of one shape
    assert a.reserve("t0001", 1, resources).ok
    first = a.settle("t0001", 1, resources, 0.0, 3600.0, gpus=1)  # an hour, where the limit is ten minutes
    assert first.used_gpu_hours == pytest.approx(1 / 6, abs=1e-6) and first.used_cpu_hours == pytest.approx(2 / 6, abs=1e-6)  # micro-hours
    again = b.settle("t0001", 1, resources, 0.0, 300.0, gpus=1)  # another process saw the end later, differently: the first stands
    assert again == first
    assert BudgetLedger.read_totals(tmp_path).reserved_gpu_hours == 0.0


def test_reconcile_flags_a_hold_on_an_ended_attempt_and_names_the_fix():
    record = ended("t0001", AttemptEnd.LOST, kind="resolved")
    journal = JournalView(JournalTotals(), {ReservationKey("t0001", 1): held()})
    rec = reconcile("s1", "miss-cost-r3", "local executor", [record], [], [], CAPS, journal, search_path="/runs/s1")
    (flag,) = [f for f in rec.flags if f.kind is FlagKind.STALE_HOLD]
    assert flag.trial_id == "t0001" and "attempt 1" in flag.detail and "0.1667 GPU-h" in flag.detail
    assert "`parcel-hpc sync /runs/s1`" in flag.detail
    assert rec.spend.held.gpu_hours == pytest.approx(1 / 6) and rec.spend.stale == 1
    settled = JournalView(journal.totals, {ReservationKey("t0001", 1): Hold(KeyState.SETTLED, 1 / 6, 2 / 6, 0.1, 0.2)})
    assert not [f for f in reconcile("s1", "m", "local executor", [record], [], [], CAPS, settled).flags if f.kind is FlagKind.STALE_HOLD]


def test_a_jobs_start_up_a_pack_gap_and_a_trial_that_never_reserved_are_counted_once():
    events = lambda tid, a, b: [  # noqa: E731  (one process, started at 4 s, runs both trials)
        ev("started", a, attempt=1, job_id="9", gpus=1, process_started=4.0),
        ev("ended", b, attempt=1, how="completed", metric=0.2),
    ]
    first = fold(spec("t0001"), [ev("submitted", 0, job_id="9"), *events("t0001", 10, 370)])
    second = fold(spec("t0002"), [ev("submitted", 0, job_id="9"), *events("t0002", 376, 736)])
    holds = {ReservationKey("t0001", 1): Hold(KeyState.SETTLED, 1 / 6, 2 / 6, 0.1, 0.2)}  # t0002 never reserved
    spent = search_spend([first, second], JournalView(JournalTotals(), holds), [JobHours(800, 1160, 1, 2)], RATES)
    assert spent.attempts.gpu_hours == pytest.approx(0.1 + 360 / 3600)
    # 6 s of start-up before the first trial, 6 s between the two: at the job's 1 GPU and 2 CPUs.
    assert spent.overhead.gpu_hours == pytest.approx(12 / 3600) and spent.overhead.cpu_hours == pytest.approx(24 / 3600)
    assert spent.selection.gpu_hours == pytest.approx(0.1)
    assert spent.charged.gpu_hours == pytest.approx(0.1)  # only the reserved attempt is charged to the cap
    assert spent.line().startswith(f"{spent.total.gpu_hours:.4f} GPU-h, {spent.total.cpu_hours:.4f} CPU-h, cost {spent.cost:.4f}")


HOURS = st.floats(min_value=0, max_value=50, allow_nan=False)


@st.composite
def searches(draw):
    records, holds = [], {}
    for i in range(draw(st.integers(0, 6))):
        tid = f"t{i:04d}"
        events, t = [ev("submitted", 0, job_id=f"j{draw(st.integers(0, 2))}")], 1.0
        for n in range(1, draw(st.integers(0, 3)) + 1):
            t += draw(st.floats(0, 5000))
            began = draw(st.one_of(st.none(), st.floats(0, t)))
            events.append(ev("started", t, attempt=n, job_id=events[0].data.job_id, gpus=draw(st.sampled_from([None, 0, 1])), process_started=began))
            if draw(st.booleans()):
                t += draw(st.floats(0, 5000))
                how = draw(st.sampled_from([AttemptEnd.INTERRUPTED, AttemptEnd.LOST, AttemptEnd.FAILED]))
                events.append(ev(draw(st.sampled_from(["ended", "resolved"])), t, attempt=n, how=how.value, **ENDINGS[how]))
            state = draw(st.sampled_from([None, KeyState.HELD, KeyState.SETTLED, KeyState.RELEASED]))
            if state is not None:
                used = (draw(HOURS), draw(HOURS)) if state is KeyState.SETTLED else (0.0, 0.0)
                holds[ReservationKey(tid, n)] = Hold(state, 1 / 6, 2 / 6, *used)
            if events[-1].kind.value == "started":
                break  # it runs: no later attempt
        records.append(fold(spec(tid), events))
    jobs = [JobHours(s, s + d, g, c) for s, d, g, c in draw(st.lists(st.tuples(HOURS, HOURS, st.integers(0, 2), st.integers(1, 4)), max_size=3))]
    return records, holds, jobs


@settings(max_examples=200, deadline=None)
@given(searches())
def test_property_the_parts_add_up_to_the_total_and_the_caps_bind_the_journal(search):
    records, holds, jobs = search
    spent = search_spend(records, JournalView(JournalTotals(), holds), jobs, RATES)
    parts = spent.parts.values()
    assert spent.total.gpu_hours == pytest.approx(sum(p.gpu_hours for p in parts))
    assert spent.total.cpu_hours == pytest.approx(sum(p.cpu_hours for p in parts))
    assert spent.cost == pytest.approx(RATES.cost(spent.total.gpu_hours, spent.total.cpu_hours))
    held = [h for h in holds.values() if h.state is KeyState.HELD]
    assert spent.held.gpu_hours == pytest.approx(sum(h.reserved_gpu_hours for h in held))
    # What the caps bind is the journal's used + held, part of the total, never more.
    used = sum(h.used_gpu_hours for h in holds.values())
    assert spent.charged.gpu_hours == pytest.approx(used + spent.held.gpu_hours)
    assert spent.charged.gpu_hours <= spent.total.gpu_hours + 1e-9
    assert spent.stale == len(stale_holds(records, holds))
    shown = spent.to_json()
    assert shown["gpu_hours"] == pytest.approx(sum(p["gpu_hours"] for p in shown["parts"].values()), abs=1e-5)


def test_a_process_start_is_read_from_proc_and_none_without_it(tmp_path):
    (tmp_path / "self").mkdir()
    # A command name with spaces and a parenthesis: fields are counted after its last ")".
    (tmp_path / "self" / "stat").write_text("42 (a (b) c) S " + " ".join(["0"] * 18) + " 250 0 0\n")
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
    assert process_started(str(tmp_path)) == pytest.approx(1000 + 250 / os.sysconf("SC_CLK_TCK"))
    assert process_started(str(tmp_path / "nowhere")) is None
    # A process started now, on Linux (not this worker: a long suite makes it older than any bound).
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "from parcel_hpc.worker.jobenv import process_started; print(repr(process_started()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    started = float(out.stdout)
    assert before - 1.0 <= started <= time.time() + 1.0  # /proc/stat's btime is whole seconds


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e-3), st.floats(0, 1e-3))
def test_the_printed_line_reads_as_the_json_rounded_once_more(gpu_hours, cpu_hours):
    # Near a half-way figure (a cost of 0.0000499999 whose JSON reads 0.000050) the text must not
    # round the raw figure down while the JSON rounds it up: both come from the same micro-hours.
    spent = Spend(Hours(gpu_hours, cpu_hours), Hours(), Hours(), Hours(), RATES)
    data = spent.to_json()
    figures = (f"{data['gpu_hours']:.4f}", f"{data['cpu_hours']:.4f}", f"{data['cost']:.4f}")
    assert spent.line().startswith(f"{figures[0]} GPU-h, {figures[1]} CPU-h, cost {figures[2]} ")
