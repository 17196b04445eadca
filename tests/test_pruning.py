"""Milestone pruning: the pure ASHA rule, and the shared-directory store raced by real processes."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.errors import CorruptRecord, ParcelError, UsageError
from parcel_hpc.pruning import AsyncSuccessiveHalving, MilestoneStore, NopPruner, PruneAction, PruneDecision

MS = (10, 20, 41, 82)
NOW = 1_700_000_000.0


def asha(eta: int = 3, min_peers: int = 4) -> AsyncSuccessiveHalving:
    return AsyncSuccessiveHalving(MS, reduction_factor=eta, min_peers=min_peers)


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def store_at(tmp_path: Path) -> MilestoneStore:
    return MilestoneStore(tmp_path / "search", MS, clock=Clock())


# -- the pure rule ----------------------------------------------------------------------------------


def test_off_milestone_step_is_never_pruned_and_consults_no_peers():
    peers_at_82 = {f"p{i}": 0.01 for i in range(8)}
    d = asha().decide("t39", 39, 99.0, peers_at_82, now=NOW)
    assert d.action is PruneAction.NOT_A_MILESTONE
    assert d.peers == () and d.threshold is None
    assert not d.action.stops_trial


def test_final_milestone_never_prunes_even_the_worst():
    d = asha(min_peers=1).decide("worst", 82, 99.0, {f"p{i}": 0.1 for i in range(10)}, now=NOW)
    assert d.action is PruneAction.FINAL and not d.action.stops_trial


def test_min_peers_must_have_reported_before_anything_is_pruned():
    rule = asha(eta=3, min_peers=4)
    three = {"a": 0.1, "b": 0.2, "c": 0.3}
    d = rule.decide("worst", 10, 9.0, three, now=NOW)
    assert d.action is PruneAction.TOO_FEW_PEERS and d.peer_values == three
    d = rule.decide("worst", 10, 9.0, {**three, "d": 0.4}, now=NOW)
    assert d.action is PruneAction.PRUNE and d.keep == 2 and d.threshold == 0.2


def test_rule_keeps_the_best_ceil_n_over_eta():
    rule = asha(eta=3, min_peers=1)
    peers = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0, "f": 6.0}  # n = 7 with the trial: keep 3
    assert rule.decide("x", 20, 2.5, peers, now=NOW).action is PruneAction.CONTINUE  # 3rd of 7
    assert rule.decide("x", 20, 3.5, peers, now=NOW).action is PruneAction.PRUNE  # 4th of 7
    assert rule.decide("x", 20, 3.5, peers, now=NOW).threshold == 3.0


def test_ties_at_the_threshold_all_continue():
    rule = asha(eta=3, min_peers=1)
    # n = 5, keep = 2: sorted [1, 2, 2, 2, 5] -> threshold 2; three trials tie at it and all continue.
    peers = {"a": 1.0, "b": 2.0, "c": 2.0, "e": 5.0}
    d = rule.decide("x", 10, 2.0, peers, now=NOW)
    assert d.action is PruneAction.CONTINUE and d.threshold == 2.0
    assert rule.decide("e", 10, 5.0, {"a": 1.0, "b": 2.0, "c": 2.0, "x": 2.0}, now=NOW).action is PruneAction.PRUNE
    everyone_equal = {f"p{i}": 0.5 for i in range(9)}
    assert rule.decide("x", 10, 0.5, everyone_equal, now=NOW).action is PruneAction.CONTINUE


def test_own_entry_in_peers_is_ignored():
    rule = asha(eta=2, min_peers=2)
    d = rule.decide("x", 10, 5.0, {"x": 0.0, "a": 1.0}, now=NOW)
    assert d.action is PruneAction.TOO_FEW_PEERS and "x" not in d.peer_ids


def test_nop_pruner_never_prunes():
    nop = NopPruner(MS)
    assert nop.decide("x", 10, 99.0, {f"p{i}": 0.0 for i in range(20)}, now=NOW).action is PruneAction.CONTINUE
    assert nop.decide("x", 39, 99.0, {}, now=NOW).action is PruneAction.NOT_A_MILESTONE
    assert nop.decide("x", 82, 99.0, {}, now=NOW).action is PruneAction.FINAL


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(milestones=()),
        dict(milestones=(20, 10)),
        dict(milestones=(0, 10)),
        dict(milestones=(10, 10)),
        dict(milestones=MS, reduction_factor=1),
        dict(milestones=MS, min_peers=0),
    ],
)
def test_bad_configuration_is_a_usage_error(kwargs):
    with pytest.raises(UsageError):
        AsyncSuccessiveHalving(**kwargs)


@pytest.mark.parametrize("value", [math.nan, math.inf, "0.3", True])
def test_non_finite_values_are_refused(value):
    with pytest.raises(UsageError):
        asha().decide("x", 10, value, {}, now=NOW)
    with pytest.raises(UsageError):
        asha().decide("x", 10, 0.3, {"a": value}, now=NOW)


def test_decision_is_validated_at_birth():
    base = dict(trial_id="x", milestone=10, value=2.0, peers=(("a", 1.0),), keep=1, reduction_factor=3, min_peers=1, pruner="asha", time=NOW)
    with pytest.raises(ParcelError):
        PruneDecision(action=PruneAction.PRUNE, threshold=2.0, **base)  # a tie cannot prune
    with pytest.raises(ParcelError):
        PruneDecision(action=PruneAction.CONTINUE, threshold=1.0, **base)
    with pytest.raises(ParcelError):
        PruneDecision(action=PruneAction.NOT_A_MILESTONE, threshold=None, **base)  # consulted no peers
    with pytest.raises(ParcelError):
        PruneDecision(action=PruneAction.CONTINUE, threshold=None, **{**base, "peers": (("x", 1.0),)})
    with pytest.raises(CorruptRecord):
        PruneDecision.from_json({"trial_id": "x"}, "somewhere.json")


values = st.integers(min_value=0, max_value=6).map(lambda i: i / 4)  # few distinct values: many ties


@settings(max_examples=400, deadline=None)
@given(
    value=values,
    peer_values=st.lists(values, max_size=14),
    eta=st.integers(min_value=2, max_value=5),
    min_peers=st.integers(min_value=1, max_value=6),
    milestone=st.sampled_from(MS[:-1]),
)
def test_property_pruned_iff_enough_peers_strictly_better(value, peer_values, eta, min_peers, milestone):
    peers = {f"p{i}": v for i, v in enumerate(peer_values)}
    d = AsyncSuccessiveHalving(MS, eta, min_peers).decide("x", milestone, value, peers, now=NOW)
    strictly_better = sum(v < value for v in peer_values)
    needed = math.ceil((len(peer_values) + 1) / eta)
    if not peer_values or value <= min(peer_values):
        assert d.action is not PruneAction.PRUNE  # the best (ties included) always goes on
    if d.action is PruneAction.PRUNE:
        assert len(peer_values) >= min_peers and strictly_better >= needed
    if len(peer_values) >= min_peers:
        assert (d.action is PruneAction.PRUNE) == (strictly_better >= needed)
    assert PruneDecision.from_json(json.loads(json.dumps(d.to_json()))) == d


@settings(max_examples=200, deadline=None)
@given(all_values=st.lists(values, min_size=1, max_size=15), eta=st.integers(min_value=2, max_value=5))
def test_property_with_everyone_reported_at_least_ceil_n_over_eta_continue(all_values, eta):
    rule = AsyncSuccessiveHalving(MS, eta, min_peers=1)
    trials = {f"t{i}": v for i, v in enumerate(all_values)}
    actions = {t: rule.decide(t, 10, v, trials, now=NOW).action for t, v in trials.items()}
    going_on = [t for t, a in actions.items() if a is not PruneAction.PRUNE]
    assert len(going_on) >= math.ceil(len(all_values) / eta)
    assert all(actions[t] is not PruneAction.PRUNE for t, v in trials.items() if v == min(all_values))


# -- the store, one process ---------------------------------------------------------------------------


def test_step_39_report_can_neither_prune_it_nor_be_used_as_a_peer(tmp_path):
    store, rule = store_at(tmp_path), asha(min_peers=2)
    for i in range(5):
        assert store.report(f"p{i}", 82, 0.1 * (i + 1), attempt=0)
    assert store.report("t39", 39, 50.0, attempt=0) is False  # terrible value, off a milestone
    assert (store.root / "off_milestone" / "39" / "t39.json").exists()
    d = store.decide(rule, "t39", 39)
    assert d.action is PruneAction.NOT_A_MILESTONE and d.peers == ()
    # A spectacular value at 39 must not prune anyone at 41 either.
    store.report("ace", 39, 0.0, attempt=0)
    for i, v in enumerate([0.5, 0.6, 0.7, 0.8]):
        store.report(f"q{i}", 41, v, attempt=0)
    decided = [store.decide(rule, f"q{i}", 41) for i in range(4)]
    assert all({"t39", "ace"}.isdisjoint(d.peer_ids) for d in decided)
    assert {"t39", "ace"}.isdisjoint(store.peers(41)) and {"t39", "ace"}.isdisjoint(store.peers(82))
    with pytest.raises(UsageError, match="not a milestone"):
        store.peers(39)


def test_decisions_use_only_same_milestone_peers(tmp_path):
    store, rule = store_at(tmp_path), asha(eta=3, min_peers=3)
    for i in range(6):
        store.report(f"p{i}", 10, 0.01, attempt=0)  # everyone excellent at 10...
        store.report(f"p{i}", 20, 9.0, attempt=0)  # ...and poor at 20
    store.report("z", 20, 5.0, attempt=0)
    d = store.decide(rule, "z", 20)
    assert d.action is PruneAction.CONTINUE  # against the 10-values it would be pruned
    assert d.peer_values == {f"p{i}": 9.0 for i in range(6)}


def test_decide_needs_a_report_and_the_search_milestones(tmp_path):
    store = store_at(tmp_path)
    with pytest.raises(UsageError, match="report"):
        store.decide(asha(), "nobody", 10)
    store.report("x", 10, 1.0, attempt=0)
    with pytest.raises(UsageError, match="frozen config"):
        store.decide(AsyncSuccessiveHalving((10, 82)), "x", 10)
    with pytest.raises(UsageError, match="started with milestones"):
        MilestoneStore(tmp_path / "search", (10, 82))


def test_exclude_keeps_a_peer_out(tmp_path):
    store, rule = store_at(tmp_path), asha(eta=2, min_peers=1)
    store.report("bad", 10, 0.0, attempt=0)
    store.report("x", 10, 1.0, attempt=0)
    d = store.decide(rule, "x", 10, exclude={"bad"})
    assert d.action is PruneAction.TOO_FEW_PEERS and d.peers == ()


def test_requeue_keeps_first_value_and_recorded_decision(tmp_path):
    store, rule = store_at(tmp_path), asha(eta=3, min_peers=2)
    for i, v in enumerate([0.2, 0.3]):
        store.report(f"p{i}", 10, v, attempt=0)
    assert store.report("x", 10, 0.15, attempt=0)
    first = store.decide(rule, "x", 10)
    assert first.action is PruneAction.CONTINUE
    # Attempt 1 after a requeue: resumed, re-reports a different value, and more peers have arrived
    # that would now prune it. The first value and the first decision stand.
    for i in range(2, 8):
        store.report(f"p{i}", 10, 0.01, attempt=0)
    assert store.report("x", 10, 0.9, attempt=1) is True
    rep = store.report_of("x", 10)
    assert (rep.value, rep.attempt) == (0.15, 0)
    again = MilestoneStore(tmp_path / "search", MS).decide(rule, "x", 10, exclude={"p0"})
    assert again == first
    assert len(list((store.root / "milestones" / "10").glob("x*.json"))) == 1
    assert [r.decision for r in store.decisions("x")] == [first]


class RacingPruner(AsyncSuccessiveHalving):
    """Lets another process's decide() win the create between our read and our write."""

    def __init__(self, store_dir: Path) -> None:
        super().__init__(MS, reduction_factor=3, min_peers=1)
        self.store_dir, self.raced = store_dir, False

    def decide(self, trial_id, milestone, value, peers, *, now=None):
        if not self.raced:
            self.raced = True
            MilestoneStore(self.store_dir, MS, clock=lambda: 42.0).decide(asha(eta=2, min_peers=1), trial_id, milestone)
        return super().decide(trial_id, milestone, value, peers, now=now)


def test_decide_losing_the_create_returns_the_winners_decision(tmp_path):
    store = store_at(tmp_path)
    for i, v in enumerate([0.1, 0.2, 0.3]):
        store.report(f"p{i}", 10, v, attempt=0)
    store.report("x", 10, 0.9, attempt=0)
    got = store.decide(RacingPruner(store.root), "x", 10)
    assert got.time == 42.0 and got.reduction_factor == 2  # the winner's, not ours
    assert [r.decision for r in store.decisions("x")] == [got]


def test_invalidate_uses_of_marks_exactly_the_decisions_that_used_the_trial(tmp_path):
    store, rule = store_at(tmp_path), asha(eta=3, min_peers=1)
    order = ["a", "b", "q", "c", "d"]  # decided in order: a and b never saw q, c and d did
    for i, t in enumerate(order):
        store.report(t, 10, 0.1 * (i + 1), attempt=0)
        store.decide(rule, t, 10)
    store.report("q", 20, 0.3, attempt=0)
    store.report("e", 20, 0.4, attempt=0)
    store.decide(rule, "e", 20)
    expected = {(r.decision.trial_id, r.decision.milestone) for r in store.decisions() if "q" in r.decision.peer_ids}
    assert expected == {("c", 10), ("d", 10), ("e", 20)}
    before = {(r.decision.trial_id, r.decision.milestone): r.decision for r in store.decisions()}

    hit = store.invalidate_uses_of("q", "quarantine:nan-loss")
    assert {(r.decision.trial_id, r.decision.milestone) for r in hit} == expected
    after = store.decisions()
    assert {(r.decision.trial_id, r.decision.milestone) for r in after if not r.valid} == expected
    assert {(r.decision.trial_id, r.decision.milestone): r.decision for r in after} == before  # not rewritten
    inv = store.decision_of("e", 20).invalidations
    assert [(i.invalid_peer, i.reason) for i in inv] == [("q", "quarantine:nan-loss")]
    store.invalidate_uses_of("q", "again")  # idempotent: no second record, first reason kept
    assert [(i.invalid_peer, i.reason) for i in store.decision_of("e", 20).invalidations] == [("q", "quarantine:nan-loss")]
    # From now on q is no peer, even for a caller that forgets to exclude it.
    store.report("f", 10, 0.05, attempt=0)
    assert "q" not in store.decide(rule, "f", 10).peer_ids and "q" not in store.peers(10)


def test_decision_racing_an_invalidation_is_marked_by_decide(tmp_path, monkeypatch):
    store, rule = store_at(tmp_path), asha(eta=3, min_peers=1)
    store.report("q", 10, 0.1, attempt=0)
    store.report("x", 10, 0.2, attempt=0)
    orig_decide = rule.decide

    def quarantine_mid_decision(*a, **k):
        # Peers were listed (q among them); q is quarantined now, and the scan runs before x's
        # decision exists: only decide()'s own re-check can mark it.
        store.invalidate_uses_of("q", "quarantine:late")
        return orig_decide(*a, **k)

    monkeypatch.setattr(rule, "decide", quarantine_mid_decision)
    d = store.decide(rule, "x", 10)
    assert "q" in d.peer_ids
    assert [i.invalid_peer for i in store.decision_of("x", 10).invalidations] == ["q"]


# -- the store, raced by real processes ---------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from parcel_hpc.pruning import AsyncSuccessiveHalving, MilestoneStore
    root, me, dup, value, go = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
    deadline = time.time() + 60
    while not os.path.exists(go):
        if time.time() > deadline:
            sys.exit("no go signal")
        time.sleep(0.002)
    store = MilestoneStore(root, (10, 20, 41, 82))
    rule = AsyncSuccessiveHalving((10, 20, 41, 82), reduction_factor=3, min_peers=3)
    dup_decision = store.decide(rule, dup, 10)          # several processes race this one decision
    assert store.report(me, 10, value, attempt=0)
    own = store.decide(rule, me, 10)
    store.report(me, 10, value + 100.0, attempt=1)       # a requeued attempt: must not replace the value
    store.report(me, 39, 0.0, attempt=1)                 # off a milestone: must never be a peer
    again = store.decide(rule, me, 10, exclude={dup})
    print(json.dumps({"dup": dup_decision.to_json(), "own": own.to_json(), "again": again.to_json()}))
    """
)


def test_concurrent_processes_report_and_decide_exactly_once(tmp_path):
    n_proc, n_dup = 14, 4
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    root = tmp_path / "search"
    store, rule = MilestoneStore(root, MS), AsyncSuccessiveHalving(MS, reduction_factor=3, min_peers=3)
    first_values = {f"d{j}": round(rng.uniform(0, 1), 6) for j in range(n_dup)}
    for t, v in first_values.items():
        store.report(t, 10, v, attempt=0)  # reported before the race; their decisions are raced
    mine = {f"t{i:02d}": round(rng.uniform(0, 1), 6) for i in range(n_proc)}
    first_values.update(mine)
    go = tmp_path / "go"
    procs = {
        t: subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), t, f"d{i % n_dup}", repr(v), str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for i, (t, v) in enumerate(mine.items())
    }
    time.sleep(0.3)  # let interpreters start so that they pile up on the go file
    go.touch()
    out = {}
    for t, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out[t] = {k: PruneDecision.from_json(v) for k, v in json.loads(stdout).items()}

    # Every report present exactly once, with its first value; nothing off-milestone leaked in.
    assert sorted(os.listdir(root / "milestones" / "10")) == sorted(f"{t}.json" for t in first_values)
    assert {t: store.report_of(t, 10).value for t in first_values} == first_values
    assert sorted(os.listdir(root / "off_milestone" / "39")) == sorted(f"{t}.json" for t in mine)

    # Every decision recorded exactly once, and what each process got is the recorded one.
    assert sorted(os.listdir(root / "prune_decisions" / "10")) == sorted(f"{t}.json" for t in first_values)
    recorded = {r.decision.trial_id: r.decision for r in store.decisions()}
    assert set(recorded) == set(first_values)
    for j in range(n_dup):
        racers = [out[t]["dup"] for i, t in enumerate(mine) if i % n_dup == j]
        assert len(racers) >= 3 and all(d == recorded[f"d{j}"] for d in racers)
    for t in mine:
        assert out[t]["own"] == out[t]["again"] == recorded[t]

    # Each decision follows from its recorded peer set, and that set holds only first milestone values.
    for d in recorded.values():
        assert rule.decide(d.trial_id, d.milestone, d.value, d.peer_values, now=d.time) == d
        assert all(first_values[p] == v for p, v in d.peers)
        assert d.value == first_values[d.trial_id]
    assert any(d.action.consults_peers and d.peers for d in recorded.values())

    # No report was lost: a decision made after the race sees every one of them.
    store.report("late", 10, 0.5, attempt=0)
    assert store.decide(rule, "late", 10).peer_ids == frozenset(first_values)
