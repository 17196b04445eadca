"""Budget admission (pure) and the reservation journal (real files, real racing processes)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from parcel_hpc.budget import (
    BudgetCaps,
    BudgetLedger,
    BudgetOutcome,
    JournalTotals,
    KeyState,
    Rates,
    Refusal,
    Reservation,
    admit_launch,
    attempt_worst_case,
    render_commitment,
    worst_case,
)
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

REPO = Path(__file__).resolve().parents[1]
N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES = 82, 1, 8, 36, 1


def caps(max_trials=82, gpu=1000.0, cost=1e6, per_gpu=1.5, per_cpu=0.0) -> BudgetCaps:
    return BudgetCaps(max_trials=max_trials, gpu_hours_cap=gpu, cost_cap=cost, rates=Rates(per_gpu, per_cpu))


def line(decision, cap_name):
    return next(x for x in decision.lines if x.cap_name == cap_name)


# -- pure admission -----------------------------------------------------------------------------


def test_worst_case_counts_every_retry_at_the_time_limit():
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5, 0.1))
    attempts = N_TRIALS * (1 + RETRIES)
    assert (c.trials, c.attempts) == (N_TRIALS, attempts)
    assert c.gpu_hours == pytest.approx(attempts * GPUS * LIMIT_MIN / 60)
    assert c.cpu_hours == pytest.approx(attempts * CPUS * LIMIT_MIN / 60)
    assert c.cost == pytest.approx(c.gpu_hours * 1.5 + c.cpu_hours * 0.1)
    assert attempt_worst_case(GPUS, CPUS, LIMIT_MIN) == pytest.approx((c.attempt_gpu_hours, c.attempt_cpu_hours))


def test_within_caps_admits():
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5))
    d = admit_launch(c, caps(gpu=c.gpu_hours, cost=c.cost))  # exactly at both caps
    assert d.ok and d.outcome.is_admit
    assert all(x.ok and x.overshoot == 0 for x in d.lines)
    d.require()


def test_over_gpu_cap_holds_with_exact_overshoot_and_working_fixes():
    cap = 50.0
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5))
    d = admit_launch(c, caps(gpu=cap))
    assert not d.ok and d.outcome == Outcome.HOLD_BUDGET and str(d.outcome) == "hold:budget"
    gpu = line(d, "budget.gpu_hours_cap")
    need = N_TRIALS * (1 + RETRIES) * GPUS * LIMIT_MIN / 60
    assert gpu.overshoot == pytest.approx(need - cap)
    assert f"needs {need:.1f} GPU-h" in d.message and f"over by {need - cap:.1f} GPU-h" in d.message
    assert f"leaves {cap:.1f} GPU-h" in d.message
    n_fit = math.floor(cap / ((1 + RETRIES) * GPUS * LIMIT_MIN / 60))
    t_fit = math.floor(cap * 60 / (N_TRIALS * (1 + RETRIES) * GPUS))
    assert f"search.n_trials to {n_fit}" in d.message
    assert f"resources.time_limit_min to {t_fit}" in d.message
    assert "raise budget.gpu_hours_cap" in d.message and "\n" not in d.message
    # each suggested value is the largest that fits
    assert admit_launch(worst_case(n_fit, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5)), caps(gpu=cap)).ok
    assert not admit_launch(worst_case(n_fit + 1, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5)), caps(gpu=cap)).ok
    assert admit_launch(worst_case(N_TRIALS, GPUS, CPUS, t_fit, RETRIES, Rates(1.5)), caps(gpu=cap)).ok
    assert not admit_launch(worst_case(N_TRIALS, GPUS, CPUS, t_fit + 1, RETRIES, Rates(1.5)), caps(gpu=cap)).ok
    with pytest.raises(GovernanceRefusal) as exc:
        d.require()
    assert str(exc.value.outcome) == "hold:budget" and exc.value.exit_code == 3


def test_already_committed_spend_shrinks_what_the_cap_leaves():
    c = worst_case(10, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5))  # 12 GPU-h
    spent = JournalTotals(reserved_gpu_hours=5.0, used_gpu_hours=10.0)
    assert admit_launch(c, caps(gpu=27.0), spent).ok
    d = admit_launch(c, caps(gpu=26.0), spent)
    assert line(d, "budget.gpu_hours_cap").overshoot == pytest.approx(1.0)
    assert "leaves 11.0 GPU-h (15.0 of 26.0 already committed)" in d.message


def test_over_cost_cap_names_the_cost_fix():
    rates = Rates(2.0, 0.05)
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, rates)
    cost_cap = c.cost * 0.75
    d = admit_launch(c, BudgetCaps(82, 1e6, cost_cap, rates))
    assert d.outcome == Outcome.HOLD_BUDGET
    assert line(d, "budget.gpu_hours_cap").ok
    cost = line(d, "budget.cost_cap")
    assert cost.overshoot == pytest.approx(c.cost - cost_cap)
    assert f"over by {c.cost - cost_cap:.1f}" in d.message and "raise budget.cost_cap" in d.message
    n_fit = math.floor(cost_cap / ((1 + RETRIES) * LIMIT_MIN / 60 * rates.cost(GPUS, CPUS)))
    assert f"search.n_trials to {n_fit}" in d.message
    assert admit_launch(worst_case(n_fit, GPUS, CPUS, LIMIT_MIN, RETRIES, rates), BudgetCaps(82, 1e6, cost_cap, rates)).ok


def test_trial_count_counts_trials_already_in_the_search():
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5))
    assert admit_launch(c, caps(max_trials=N_TRIALS), trials_already=0).ok
    d = admit_launch(c, caps(max_trials=N_TRIALS), trials_already=1)
    assert d.outcome == Outcome.HOLD_BUDGET and line(d, "budget.max_trials").overshoot == 1
    assert f"over budget.max_trials={N_TRIALS} by 1" in d.message
    assert f"lower search.n_trials to {N_TRIALS - 1} or raise budget.max_trials to {N_TRIALS + 1}" in d.message


def test_zero_gpu_trials_commit_no_gpu_hours_but_count_and_cost():
    rates = Rates(1.5, 0.1)
    c = worst_case(N_TRIALS, 0, 4, LIMIT_MIN, RETRIES, rates)
    assert c.gpu_hours == 0 and c.cost == pytest.approx(c.cpu_hours * 0.1)
    assert admit_launch(c, BudgetCaps(N_TRIALS, 0.0, c.cost, rates)).ok  # a zero GPU-h cap admits them
    assert not admit_launch(c, BudgetCaps(N_TRIALS - 1, 0.0, c.cost, rates)).ok  # the trial count still binds
    assert not admit_launch(c, BudgetCaps(N_TRIALS, 0.0, c.cost / 2, rates)).ok  # and so does their CPU cost


def test_bad_values_are_refused_at_birth_naming_the_key():
    with pytest.raises(UsageError, match="resources.gpus"):
        worst_case(1, -1, 1, 10, 0, Rates(1.0))
    with pytest.raises(UsageError, match="resources.time_limit_min"):
        worst_case(1, 1, 1, 0, 0, Rates(1.0))
    with pytest.raises(UsageError, match="budget.gpu_hours_cap"):
        caps(gpu=float("nan"))
    with pytest.raises(UsageError, match="budget.max_trials"):
        caps(max_trials=0)
    with pytest.raises(UsageError, match="budget.cost_cap is not set"):
        BudgetCaps.from_config({"max_trials": 3, "gpu_hours_cap": 1.0, "rate_per_gpu_hour": 1.0})


def test_caps_from_hydra_config():
    cfg = OmegaConf.create({"budget": {"max_trials": 82, "gpu_hours_cap": 50, "cost_cap": 200.0, "rate_per_gpu_hour": 1.5, "max_retries": 1}})
    assert BudgetCaps.from_config(cfg.budget) == BudgetCaps(82, 50.0, 200.0, Rates(1.5, 0.0))


def test_render_commitment_shows_each_cap():
    c = worst_case(N_TRIALS, GPUS, CPUS, LIMIT_MIN, RETRIES, Rates(1.5))
    text = render_commitment(admit_launch(c, caps(gpu=50.0)))
    for name in ("budget.max_trials", "budget.gpu_hours_cap", "budget.cost_cap"):
        assert name in text
    assert f"OVER by {c.gpu_hours - 50:.1f}" in text and "=> hold:budget" in text
    assert f"{c.gpu_hours:.1f}" in text and str(N_TRIALS) in text


# -- the journal, one process -------------------------------------------------------------------


def test_settle_releases_the_unused_part_and_totals_track_each_kind(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=10.0, cost=100.0, per_gpu=2.0, per_cpu=0.1))
    a = ledger.reserve("t1", 0, 2.0, 8.0)
    b = ledger.reserve("t2", 0, 2.0, 8.0)
    assert isinstance(a, Reservation) and a.ok and b.seq == a.seq + 1
    t = ledger.totals()
    assert (t.reserved_gpu_hours, t.used_gpu_hours, t.released_gpu_hours, t.attempts, t.trials) == (4.0, 0.0, 0.0, 2, 2)

    s = ledger.settle(a, 0.5, 3.0)
    assert s.state is KeyState.SETTLED and (s.released_gpu_hours, s.released_cpu_hours) == (1.5, 5.0)
    r = ledger.release(("t2", 0))
    assert r.state is KeyState.RELEASED and r.released_gpu_hours == 2.0
    t = ledger.totals()
    assert (t.reserved_gpu_hours, t.used_gpu_hours, t.released_gpu_hours) == (0.0, 0.5, 3.5)
    assert (t.reserved_cpu_hours, t.used_cpu_hours, t.released_cpu_hours) == (0.0, 3.0, 13.0)
    assert t.committed_cost(ledger.caps.rates) == pytest.approx(0.5 * 2.0 + 3.0 * 0.1)
    assert BudgetLedger(tmp_path).verify() == t  # another reader replays the same totals


def test_refusal_is_an_outcome_and_settling_makes_room(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    first = ledger.reserve("t1", 0, 0.6)
    refused = ledger.reserve("t2", 0, 0.6)
    assert isinstance(refused, Refusal) and not refused.ok and refused.outcome is BudgetOutcome.EXHAUSTED
    assert refused.outcome.value == "budget_exhausted"
    assert [x.cap_name for x in refused.lines] == ["budget.gpu_hours_cap"]
    assert refused.lines[0].overshoot == pytest.approx(0.2) and "budget.gpu_hours_cap" in refused.message
    assert ledger.totals().attempts == 1  # a refusal writes nothing
    ledger.settle(first, 0.25)
    assert ledger.reserve("t2", 0, 0.6).ok


def test_max_trials_binds_new_trials_but_not_retries(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(max_trials=2))
    assert ledger.reserve("t1", 0, 0.1).ok and ledger.reserve("t2", 0, 0.1).ok
    third = ledger.reserve("t3", 0, 0.1)
    assert not third.ok and third.lines[0].cap_name == "budget.max_trials"
    assert ledger.reserve("t1", 1, 0.1).ok  # a retry of a counted trial


def test_overrun_is_recorded_as_measured_and_blocks_later_reservations(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    s = ledger.settle(ledger.reserve("t1", 0, 0.6), 1.1)  # ran past its worst case (epilog, grace)
    assert (s.used_gpu_hours, s.released_gpu_hours) == (1.1, 0.0)
    assert ledger.totals().used_gpu_hours == 1.1
    assert not ledger.reserve("t2", 0, 0.1).ok
    assert ledger.reserve("t3", 0, 0.0).ok  # asking for nothing never breaks a cap


def test_re_reserve_of_the_same_attempt_returns_the_existing_reservation(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    first = ledger.reserve("t1", 0, 0.6)
    again = BudgetLedger(tmp_path).reserve("t1", 0, 0.9)  # a requeued attempt, another process
    assert again == first and ledger.totals().reserved_gpu_hours == 0.6 and ledger.totals().attempts == 1
    ledger.settle(first, 0.2)
    assert ledger.settle(("t1", 0), 0.2).seq == ledger.settle(first, 0.2).seq  # same settle: no new entry
    with pytest.raises(UsageError, match="a second, different close"):
        ledger.settle(first, 0.3)
    with pytest.raises(UsageError, match="new attempt number"):
        ledger.reserve("t1", 0, 0.6)
    with pytest.raises(UsageError, match="no reservation for t9/0"):
        ledger.release(("t9", 0))
    assert len(os.listdir(ledger.path)) == 3  # open, reserve, settle


def test_caps_are_recorded_once_and_frozen(tmp_path):
    with pytest.raises(UsageError, match="no budget journal"):
        BudgetLedger(tmp_path)
    BudgetLedger(tmp_path, caps(gpu=1.0))
    with pytest.raises(UsageError, match="frozen with the search's contract; a changed budget needs a new search.revision"):
        BudgetLedger(tmp_path, caps(gpu=2.0))
    worker = BudgetLedger(tmp_path)
    assert worker.reserve("t1", 0, 0.6).ok and not worker.reserve("t2", 0, 0.6).ok


def test_a_caps_entry_in_an_older_journal_still_reads(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    ledger.reserve("t1", 0, 0.6)
    last = ledger.path / "00000001.json"
    old = json.loads(last.read_text())  # an entry as amend_caps used to write it: totals unchanged
    entry = {
        "v": 1,
        "seq": 2,
        "kind": "caps",
        "prev": "sha256:" + hashlib.sha256(last.read_bytes()).hexdigest(),
        "totals": old["totals"],
        "caps": caps(gpu=2.0).to_json(),
        "at": 0.0,
        "writer": "old",
    }
    (ledger.path / "00000002.json").write_bytes((json.dumps(entry) + "\n").encode())
    assert BudgetLedger(tmp_path).caps == caps(gpu=2.0)
    assert BudgetLedger(tmp_path).reserve("t2", 0, 0.6).ok  # the journal's latest caps bind
    assert BudgetLedger.read_totals(tmp_path).reserved_gpu_hours == 1.2


def tree_listing(root: Path) -> list[tuple[str, int, int]]:
    """Every path under ``root`` (root included) with its size and mtime in ns."""
    paths = [root, *sorted(root.rglob("*"))]
    return [(str(p.relative_to(root)), p.lstat().st_size, p.lstat().st_mtime_ns) for p in paths]


def test_read_totals_writes_nothing(tmp_path):
    assert BudgetLedger.read_totals(tmp_path) is None  # no journal: nothing spent, nothing created
    assert list(tmp_path.iterdir()) == []
    ledger = BudgetLedger(tmp_path, caps(gpu=10.0))
    ledger.settle(ledger.reserve("t1", 0, 2.0, 1.0), 0.5, 0.25)
    ledger.reserve("t2", 0, 1.0)
    expected = ledger.totals()
    before = tree_listing(tmp_path)
    assert BudgetLedger.read_totals(tmp_path) == expected
    assert tree_listing(tmp_path) == before

    empty = tmp_path / "empty"
    (empty / "budget" / "journal").mkdir(parents=True)  # a journal being opened, or whose opener died before entry 0
    before = tree_listing(empty)
    assert BudgetLedger.read_totals(empty) is None  # nothing reserved yet: a read command goes on
    assert tree_listing(empty) == before
    with pytest.raises(UsageError, match="has no caps yet"):
        BudgetLedger(empty)  # a writer must bring the caps
    opened = BudgetLedger(empty, caps(gpu=3.0))  # the next launch opens it
    assert BudgetLedger.read_totals(empty) == opened.totals()


def test_a_damaged_entry_is_named(tmp_path):
    ledger = BudgetLedger(tmp_path, caps())
    for i in range(3):
        ledger.reserve(f"t{i}", 0, 0.5)
    entry = ledger.path / "00000002.json"
    doc = json.loads(entry.read_text())
    doc["totals"]["reserved_gpu_uh"] -= 1
    entry.write_text(json.dumps(doc))
    with pytest.raises(CorruptRecord, match="00000002.json.*running totals"):
        BudgetLedger(tmp_path).totals()

    entry.write_text("{not json")
    with pytest.raises(CorruptRecord, match="00000002.json is not valid JSON"):
        BudgetLedger(tmp_path).totals()


def test_a_replaced_entry_breaks_the_chain_and_a_gap_is_found(tmp_path):
    ledger = BudgetLedger(tmp_path, caps())
    for i in range(3):
        ledger.reserve(f"t{i}", 0, 0.5)
    first = ledger.path / "00000001.json"
    doc = json.loads(first.read_text())
    doc["writer"] = "someone-else"  # same totals, different bytes
    first.write_text(json.dumps(doc))
    with pytest.raises(CorruptRecord, match="00000002.json does not chain"):
        BudgetLedger(tmp_path).totals()
    first.unlink()
    with pytest.raises(CorruptRecord, match="00000001.json is missing"):
        ledger.verify()


def test_a_new_reader_starts_from_the_newest_fold_checkpoint(tmp_path, monkeypatch):
    """A reader replays at most FOLD_EVERY entries, not the whole journal: entries before the newest
    fold checkpoint are not read again (verify still reads them), and a fold that does not chain to
    its entry is passed over."""
    from parcel_hpc.budget import _journal

    monkeypatch.setattr(_journal, "FOLD_EVERY", 4)
    ledger = BudgetLedger(tmp_path, caps(max_trials=100))
    for i in range(10):
        ledger.reserve(f"t{i}", 0, 0.5)
        ledger.settle((f"t{i}", 0), 0.25)
    folds = ledger.path.parent / "folds"
    assert sorted(p.name for p in folds.iterdir()) == ["00000004.json", "00000008.json", "00000012.json", "00000016.json", "00000020.json"]
    totals = ledger.totals()
    (ledger.path / "00000002.json").write_text("{damaged after the fact")
    fresh = BudgetLedger(tmp_path)
    assert fresh.totals() == totals  # started at the fold of entry 20
    with pytest.raises(UsageError, match="t3/0 was already settled"):
        fresh.reserve("t3", 0, 0.5)  # closed keys are in the fold
    with pytest.raises(CorruptRecord, match="00000002.json is not valid JSON"):
        ledger.verify()
    last = ledger.path / "00000020.json"
    kept = last.read_bytes()
    last.write_text("{}")  # fold 20 no longer chains: fold 16 is used, and entry 20 is replayed
    with pytest.raises(CorruptRecord, match="00000020.json is not a version-1"):
        BudgetLedger(tmp_path).totals()
    last.write_bytes(kept)
    for fold in folds.iterdir():
        fold.write_text("{torn")  # no fold loads: everything is replayed from entry 0
    with pytest.raises(CorruptRecord, match="00000002.json is not valid JSON"):
        BudgetLedger(tmp_path).totals()


# -- property: any sequence of operations keeps the caps and the books ---------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 4), st.integers(0, 2), st.floats(0, 1.5), st.floats(0, 6), st.integers(0, 1)),
        st.tuples(st.just("settle"), st.integers(0, 20), st.floats(0, 1), st.integers(0, 1)),
        st.tuples(st.just("release"), st.integers(0, 20), st.integers(0, 1)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, gpu_cap=st.floats(0, 4), cost_cap=st.floats(0, 10), max_trials=st.integers(1, 5))
def test_property_reserved_plus_used_never_exceeds_the_cap(ops, gpu_cap, cost_cap, max_trials):
    uh = lambda h: round(h * 1_000_000)  # noqa: E731  the journal's unit
    c = caps(max_trials=max_trials, gpu=gpu_cap, cost=cost_cap, per_gpu=2.0, per_cpu=0.25)
    with tempfile.TemporaryDirectory() as d:
        ledgers = (BudgetLedger(d, c), BudgetLedger(d))  # two handles on one journal, interleaved
        held: dict[tuple, tuple[int, int]] = {}
        closed: dict[tuple, tuple[int, int, int, int]] = {}  # reserved gpu, cpu, used gpu, cpu
        for op in ops:
            ledger = ledgers[op[-1]]
            if op[0] == "reserve":
                _, trial, attempt, g, cpu_h, _ = op
                key = (f"t{trial}", attempt)
                if key in closed:
                    with pytest.raises(UsageError, match="new attempt number"):
                        ledger.reserve(*key, g, cpu_h)
                    continue
                before = ledger.totals()
                r = ledger.reserve(*key, g, cpu_h)
                if key in held:
                    assert r.ok and (uh(r.gpu_hours), uh(r.cpu_hours)) == held[key]
                elif r.ok:
                    held[key] = (uh(g), uh(cpu_h))
                else:
                    assert (
                        before.committed_gpu_hours + g > gpu_cap - 1e-6
                        or before.committed_cost(c.rates) + c.rates.cost(g, cpu_h) > cost_cap * (1 - 1e-9)
                        or before.trials >= max_trials
                    )
            elif held:
                key = sorted(held)[op[1] % len(held)]
                g, cpu = held.pop(key)
                if op[0] == "settle":
                    ug, uc = uh(g * op[2] / 1e6), uh(cpu * op[2] / 1e6)
                    s = ledger.settle(key, ug / 1e6, uc / 1e6)
                else:
                    ug = uc = 0
                    s = ledger.release(key)
                closed[key] = (g, cpu, ug, uc)
                assert (uh(s.released_gpu_hours), uh(s.released_cpu_hours)) == (g - ug, cpu - uc)
            t = ledgers[0].totals()
            assert t.committed_gpu_hours <= gpu_cap + 1e-9
            assert t.committed_cost(c.rates) <= cost_cap + 1e-6
            assert uh(t.reserved_gpu_hours) == sum(g for g, _ in held.values())
            assert uh(t.reserved_cpu_hours) == sum(cpu for _, cpu in held.values())
            assert uh(t.used_gpu_hours) == sum(v[2] for v in closed.values())
            assert uh(t.released_gpu_hours) == sum(v[0] - v[2] for v in closed.values())
            assert uh(t.released_cpu_hours) == sum(v[1] - v[3] for v in closed.values())
            assert t.attempts == len(held) + len(closed)
            assert t.trials == len({k[0] for k in [*held, *closed]}) <= max_trials
        assert BudgetLedger(d).verify() == ledgers[1].totals()


# -- real processes racing ----------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from parcel_hpc.budget import BudgetLedger
    search_dir, go, keys = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    ledger = BudgetLedger(search_dir)  # the caps the journal records
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    out = []
    for trial, attempt, hours in keys:
        r = ledger.reserve(trial, attempt, hours, 0.0)
        out.append({"key": [trial, attempt], "ok": r.ok, "seq": getattr(r, "seq", None)})
    print(json.dumps(out), flush=True)
    """
)


def race(search_dir: Path, keys_per_proc: list[list]) -> list[dict]:
    go = search_dir / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(search_dir), str(go), json.dumps(keys)], stdout=subprocess.PIPE, text=True, cwd=REPO)
        for keys in keys_per_proc
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()  # every process is loaded and polling: they start together
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results.extend(json.loads(out))
    return results


def entry_names(ledger: BudgetLedger) -> list[str]:
    return sorted(n for n in os.listdir(ledger.path) if not n.startswith("."))


def test_racing_processes_never_overshoot_the_cap(tmp_path):
    n_procs, per_proc, hours = 12, 3, 0.6
    fits = 14
    cap = fits * hours + hours / 2  # room for 14 of the 36 attempts, and half of a 15th
    ledger = BudgetLedger(tmp_path, caps(max_trials=100, gpu=cap))
    results = race(tmp_path, [[[f"p{p}-t{k}", 0, hours] for k in range(per_proc)] for p in range(n_procs)])

    admitted = [r for r in results if r["ok"]]
    assert len(results) == n_procs * per_proc
    assert len(admitted) == math.floor(cap / hours)
    totals = ledger.verify()
    assert totals.reserved_gpu_hours <= cap and totals.attempts == len(admitted)
    assert sorted(r["seq"] for r in admitted) == list(range(1, len(admitted) + 1))
    assert entry_names(ledger) == [f"{i:08d}.json" for i in range(len(admitted) + 1)]  # gap-free
    writers = {json.loads((ledger.path / n).read_text()).get("writer") for n in entry_names(ledger)[1:]}
    assert len(writers) > 1  # the race was real: several processes appended


def test_racing_requeues_of_one_attempt_share_one_reservation(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    results = race(tmp_path, [[["t1", 0, 0.6]] for _ in range(8)])
    assert all(r["ok"] and r["seq"] == 1 for r in results)
    assert entry_names(ledger) == ["00000000.json", "00000001.json"]
    assert ledger.totals().reserved_gpu_hours == 0.6


CRASHER = textwrap.dedent(
    """
    import os, sys, time
    from parcel_hpc.budget import BudgetLedger
    ledger = BudgetLedger(sys.argv[1])
    os.fsync = lambda fd: (print("writing", flush=True), time.sleep(3600))  # stall mid-write, to be killed
    ledger.reserve("t1", 0, 0.6)
    """
)


def test_a_writer_killed_mid_write_cannot_wedge_the_journal(tmp_path):
    ledger = BudgetLedger(tmp_path, caps(gpu=1.0))
    p = subprocess.Popen([sys.executable, "-c", CRASHER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout.readline().strip() == "writing"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    leftovers = [n for n in os.listdir(ledger.path) if n.startswith(".")]
    assert leftovers and not (ledger.path / "00000001.json").exists()  # a temp file, never a half entry
    r = BudgetLedger(tmp_path).reserve("t2", 0, 0.6)
    assert r.ok and r.seq == 1
    assert ledger.verify().reserved_gpu_hours == 0.6
