"""Selection's pure decisions and records: the disposition with the project card's semantics, the
slice gate, clean lineage, the policy's checks, the selection journal, and the batch templates."""

import re
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import Admitted, Executor, JobRole, SearchDir, TrialRecord, TrialSpec, TrialState
from parcel_hpc.ledger.selection import Decided, Frozen, SelectionWriter, fold_selection, read_selection_events
from parcel_hpc.scheduler.slurm import sbatch
from parcel_hpc.selection.actions import checked_text
from parcel_hpc.selection.candidates import Entry, TrialFacts, best_candidate, completed_list, lineage_problems, list_digest
from parcel_hpc.selection.disposition import disposition
from parcel_hpc.selection.gangs import unlike_ranks
from parcel_hpc.selection.gates import GATES, Comparison, GateFacts, JudgedOn, ParityCheck, Performance, RerunCheck, Slices
from parcel_hpc.selection.policy import GatePolicy, pinned_selection
from parcel_hpc.selection.slices import Finding, GateResult, shipment_buckets, slice_gate, slice_report
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.trainer import BUILTIN, trainer_identity

GATE = GatePolicy(max_recall_drop=0.05, max_miss_cost_rise=0.25, min_recall={"crushed_corner": 0.75}, min_examples=5)
OK_RERUN = RerunCheck(0.50, 0.50, 0.02, 0.50)


def entries(*rows):
    return tuple(Entry(tid, "sha256:" + "0" * 64, metric, ok, () if ok else ("quarantined",)) for tid, metric, ok in rows)


# --- the disposition ------------------------------------------------------------------------------


def passing(**change) -> GateFacts:
    """A selected trial's evidence that clears every gate select judges; ``change``: what differs."""
    base = GateFacts(True, rerun=OK_RERUN, parity=ParityCheck(0.0, 1e-6), performance=Comparison(0.40, 0.50, 0.0), slices=GateResult(()))
    return replace(base, **change)


FAILED_SLICE = GateResult((Finding("damage_type", "crushed_corner", "recall_drop", 0.81, 0.90, 0.05, False),))


def test_the_project_cards_examples():
    """parcel-47 improves the objective but fails its slice gate; parcel-82 passes everything."""
    listed = entries(("parcel-47", 0.40, True), ("parcel-82", 0.45, True))
    assert disposition(2, 82, listed, "parcel-47", passing(slices=FAILED_SLICE)).outcome == Outcome.HOLD_SLICE_QUALITY
    assert disposition(2, 82, listed, "parcel-82", passing()).outcome == Outcome.EVALUATE_FINAL


@pytest.mark.parametrize("n_trials, budget", [(2, 0), (2, -1), (83, 82)])
def test_budget_comes_first(n_trials, budget):
    listed = entries(("t1", 0.4, True))
    verdict = disposition(n_trials, budget, listed, "t1", passing())
    assert verdict.outcome == Outcome.HOLD_BUDGET
    assert str(n_trials) in verdict.reasons[0]


def test_a_selection_without_a_trial_is_an_invalid_winner():
    v = disposition(3, 82, (), "", GateFacts(False))
    assert v.outcome == Outcome.HOLD_INVALID_WINNER and v.reasons == ("no completed trial to select",)


def test_a_winner_without_clean_lineage_or_outside_tolerance_is_invalid():
    listed = entries(("t1", 0.40, False), ("t2", 0.45, True))
    v = disposition(2, 82, listed, "t1", passing())
    assert v.outcome == Outcome.HOLD_INVALID_WINNER and "quarantined" in v.reasons[0]
    assert disposition(2, 82, listed, "t9", passing()).outcome == Outcome.HOLD_INVALID_WINNER
    far = RerunCheck(0.45, 0.52, 0.02, 0.45)
    v = disposition(2, 82, listed, "t2", passing(rerun=far))
    assert v.outcome == Outcome.HOLD_INVALID_WINNER
    assert any("0.4500" in r and "0.5200" in r for r in v.reasons), v.reasons  # both numbers
    assert disposition(2, 82, listed, "t2", passing(rerun=RerunCheck(0.45, None, 0.02))).outcome == Outcome.HOLD_INVALID_WINNER
    # The selected artifact must rescore to the number it was selected by.
    assert not RerunCheck(0.45, 0.45, 0.02, artifact_metric=0.47).within


def test_only_a_decision_lifts_a_decidable_hold():
    listed = entries(("t1", 0.40, True))
    slice_decided = frozenset({Outcome.HOLD_SLICE_QUALITY})
    assert disposition(1, 82, listed, "t1", passing(slices=FAILED_SLICE, decided=slice_decided)).outcome == Outcome.EVALUATE_FINAL
    # No report: nothing to decide on.
    assert disposition(1, 82, listed, "t1", passing(slices=None, decided=slice_decided)).outcome == Outcome.HOLD_SLICE_QUALITY
    # A decision cannot lift an invalid winner, nor serving parity, nor a hold it did not name.
    assert (
        disposition(1, 82, listed, "t1", passing(rerun=RerunCheck(0.4, 0.6, 0.02), slices=FAILED_SLICE, decided=slice_decided)).outcome
        == Outcome.HOLD_INVALID_WINNER
    )
    assert disposition(1, 82, listed, "t1", passing(parity=ParityCheck(0.1, 1e-6), decided=slice_decided)).outcome == Outcome.HOLD_SERVING_PARITY
    worse = passing(performance=Comparison(0.5850, 0.5272, 0.0))
    assert disposition(1, 82, listed, "t1", replace(worse, decided=slice_decided)).outcome == Outcome.HOLD_PERFORMANCE
    assert disposition(1, 82, listed, "t1", replace(worse, decided=frozenset({Outcome.HOLD_PERFORMANCE}))).outcome == Outcome.EVALUATE_FINAL
    assert not Outcome.HOLD_INVALID_WINNER.is_decidable and not Outcome.HOLD_SERVING_PARITY.is_decidable


def test_a_winner_worse_than_the_baseline_on_validation_is_held_at_select_with_its_rule_and_numbers():
    """The issue's case: 0.5850 against the baseline's 0.5272 was evaluate:final-holdout."""
    v = disposition(1, 82, entries(("t1", 0.5850, True)), "t1", passing(performance=Comparison(0.5850, 0.5272, 0.0)))
    assert v.outcome == Outcome.HOLD_PERFORMANCE
    said = "\n".join(v.reasons)
    assert Performance.definition in said and "(0)" in said  # the rule, with the pinned margin
    assert "winner 0.5850, baseline 0.5272, limit 0.5272 (baseline + 0): over by 0.0578" in said
    assert "parcel-hpc decide" in said  # how to lift it
    # Within the pinned margin it passes; the margin is the contract's, never a command's.
    assert disposition(1, 82, entries(("t1", 0.5850, True)), "t1", passing(performance=Comparison(0.5850, 0.5272, 0.06))).outcome == Outcome.EVALUATE_FINAL


def test_a_k_fold_winner_is_said_to_be_judged_on_its_out_of_fold_predictions():
    worse = passing(performance=Comparison(0.5850, 0.5272, 0.0))
    said = "\n".join(disposition(1, 82, entries(("t1", 0.5850, True)), "t1", worse).reasons)
    assert "found: validation miss-cost winner 0.5850" in said
    folded = "\n".join(disposition(1, 82, entries(("t1", 0.5850, True)), "t1", replace(worse, judged_on=JudgedOn.OUT_OF_FOLD)).reasons)
    assert "found: out-of-fold miss-cost winner 0.5850" in folded and "found: validation" not in folded
    slices = passing(slices=GateResult(()), judged_on=JudgedOn.OUT_OF_FOLD)
    assert Slices().found(slices) == "0 slice checks on out-of-fold predictions, none failed"
    assert Slices().found(replace(slices, judged_on=JudgedOn.VALIDATION)) == "0 slice checks on validation, none failed"


def test_the_final_rule_is_a_decidable_hold_and_without_one_the_final_result_decides_nothing():
    listed = entries(("t1", 0.40, True))
    after = passing(final_matches=True, final=Comparison(0.6848, 0.6818, None))
    v = disposition(1, 82, listed, "t1", after, after_final=True)
    assert v.outcome == Outcome.RELEASE_REGISTERED and "reported, no rule pinned" in v.judgements[-1].found
    pinned = replace(after, final=Comparison(0.6848, 0.6818, 0.0))
    v = disposition(1, 82, listed, "t1", pinned, after_final=True)
    assert v.outcome == Outcome.HOLD_FINAL_PERFORMANCE and "over by 0.0030" in "\n".join(v.reasons)
    assert Outcome.HOLD_FINAL_PERFORMANCE.is_decidable
    lifted = replace(pinned, decided=frozenset({Outcome.HOLD_FINAL_PERFORMANCE}))
    assert disposition(1, 82, listed, "t1", lifted, after_final=True).outcome == Outcome.RELEASE_REGISTERED


def test_every_gates_definition_is_the_docs_word_for_word():
    """Every hold's text is checked against the docs' definition: what select, release, the packet
    and the MLflow tags say a rule is is what docs/selection-and-release.md defines."""
    docs = " ".join((Path(__file__).parent.parent / "docs" / "selection-and-release.md").read_text().split())
    for gate in GATES:
        assert f"`{gate.name}`" in docs and str(gate.hold) in docs and gate.definition in docs, gate.name


# --- slices and the gate ----------------------------------------------------------------------------


def _report(scores, labels, damage):
    return slice_report(np.asarray(scores), np.asarray(labels, bool), {"damage_type": np.asarray(damage)}, MissCost("miss-cost-r3", 5.0, 1.0))


def test_a_global_win_that_loses_on_crushed_corner_fails_the_gate():
    damage = ["crushed_corner"] * 10 + ["torn"] * 10
    labels = [True] * 20
    baseline = _report([0.9] * 9 + [0.0] + [0.0] * 5 + [0.9] * 5, labels, damage)  # crushed 9/10, torn 5/10
    winner = _report([0.9] * 6 + [0.0] * 4 + [0.9] * 10, labels, damage)  # crushed 6/10, torn 10/10
    assert winner[0].miss_cost < baseline[0].miss_cost  # better overall
    result = slice_gate(winner, baseline, GATE)
    failed = {(f.value, f.check) for f in result.failures}
    assert ("crushed_corner", "recall_drop") in failed and ("crushed_corner", "min_recall") in failed
    assert not any(v == "torn" for v, _ in failed)
    assert not result.passed


@pytest.mark.parametrize("named", ["crushed-corner", "puncture"])
def test_a_value_threshold_on_a_slice_that_is_absent_or_has_no_positive_fails(named):
    damage = ["crushed_corner"] * 10 + ["puncture"] * 10
    labels = [True] * 10 + [False] * 10  # puncture: no positive, so no recall to check
    rows = _report([0.9] * 20, labels, damage)
    result = slice_gate(rows, rows, replace(GATE, min_recall={named: 0.5}))
    assert not result.passed
    (finding,) = result.failures
    assert finding.value == named and finding.check == "min_recall" and finding.winner is None


def test_small_slices_are_reported_not_gated():
    damage = ["crushed_corner"] * 3 + ["torn"] * 10
    labels = [True] * 13
    baseline = _report([0.9] * 13, labels, damage)
    winner = _report([0.0] * 3 + [0.9] * 10, labels, damage)
    gate = replace(GATE, min_recall={})
    assert slice_gate(winner, baseline, gate).passed  # 3 frames < min_examples
    assert [r.value for r in winner] == ["all", "crushed_corner", "torn"]


def test_shipment_buckets_are_stable_names():
    ids = np.array(["SHP-0001", "SHP-0002", "SHP-0001"])
    b = shipment_buckets(ids, 4)
    assert b[0] == b[2] and all(re.fullmatch(r"b[0-3]", x) for x in b)
    assert list(shipment_buckets(ids, 4)) == list(b)


# --- lineage ------------------------------------------------------------------------------------------


CONTRACT = Contract(
    {
        "snapshot_digest": "sha256:snap",
        "split_digest": "sha256:split",
        "metric_revision": "miss-cost-r3",
        "search_revision": "r1",
        "image_digest": "sha256:img",
        "trainer": {"target": "x:Y", "unit": "step", "source_digest": "sha256:code"},
    }
)
SEEN = Admitted("sha256:snap", "sha256:split", "sha256:img", "sha256:code")


def record(tid, state=TrialState.COMPLETED, metric=0.5, **kw):
    spec = TrialSpec(tid, 0, {"lr": 0.1}, 1, "sha256:" + tid.encode().hex().ljust(64, "0"), "sha256:c", "sha256:img", {})
    return TrialRecord(spec, state, metric=metric if state is TrialState.COMPLETED else None, **kw)


def test_clean_lineage_and_each_way_it_breaks():
    assert lineage_problems(TrialFacts(record("t1"), SEEN), CONTRACT) == ()
    assert "state pruned" in lineage_problems(TrialFacts(record("t1", TrialState.PRUNED), SEEN), CONTRACT)[0]
    assert "admitted" in lineage_problems(TrialFacts(record("t1"), None), CONTRACT)[0]
    other = lineage_problems(TrialFacts(record("t1"), replace(SEEN, split_digest="sha256:other")), CONTRACT)
    assert "split sha256:other" in other[0]
    assert "quarantined" in lineage_problems(TrialFacts(record("t1", quarantines=("shared prefix",)), SEEN), CONTRACT)[0]
    assert "invalidated peer" in lineage_problems(TrialFacts(record("t1"), SEEN, ("milestone 20 used t9",)), CONTRACT)[0]


def test_the_completed_list_is_ordered_and_its_digest_covers_it():
    facts = [TrialFacts(record("t2", metric=0.4), None), TrialFacts(record("t1", metric=0.45), SEEN), TrialFacts(record("t3", TrialState.FAILED), SEEN)]
    listed = completed_list(facts, CONTRACT)
    assert [e.trial_id for e in listed] == ["t2", "t1"]
    assert best_candidate(listed).trial_id == "t1"  # t2 is better but its lineage is not clean
    assert list_digest(listed) != list_digest(listed[:1])


# --- the policy and the inputs --------------------------------------------------------------------------


POLICY = {
    "revision": "gate-r1",
    "rerun_tolerance": 0.02,
    "parity_tolerance": 1e-6,
    "baseline": {"name": "approved", "params": {"lr": 0.01}},
    "slices": {"columns": ["damage_type"], "shipment_buckets": 4, "min_examples": 15},
    "gate": {"max_recall_drop": 0.05, "max_miss_cost_rise": 0.25, "min_recall": {"crushed_corner": 0.75}},
}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"rerun_tolerance": -1}, "rerun_tolerance"),
        ({"gate": {**POLICY["gate"], "min_recall": {"crushed_corner": 1.5}}}, "min_recall.crushed_corner"),
        ({"slices": {**POLICY["slices"], "columns": ["colour"]}}, "columns"),
        ({"baseline": {"name": "approved", "params": {"lr": None}}}, "baseline.params.lr"),
        ({"baseline": {"name": " ", "params": {"lr": 0.01}}}, "baseline.name"),
    ],
)
def test_a_malformed_policy_is_one_line_naming_the_field(change, needle):
    with pytest.raises(UsageError) as exc:
        pinned_selection({**POLICY, **change}, trainer_identity(BUILTIN))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text", ["two\nlines", "bell\x07", "x" * 501])
def test_decision_text_is_one_printable_line(text):
    with pytest.raises(UsageError):
        checked_text("--reason", text, required=True)
    with pytest.raises(UsageError):
        checked_text("--by", "  ", required=True)


# --- the selection journal ----------------------------------------------------------------------------


def test_selection_events_round_trip_and_fold(tmp_path):
    w = SelectionWriter(tmp_path, "test")
    w.frozen(Frozen(1, "t1", 0.5, "sha256:l", 3, 2, False, "", "me"))
    w.job_submitted(1, JobRole.RERUN, "123", Executor("local"), "node1")
    w.job_ended(1, JobRole.RERUN, "123", True, "sha256:r")
    w.disposed(1, Outcome.HOLD_SLICE_QUALITY, ["gate failed"])
    w.decided(Decided(1, "t1", Outcome.HOLD_SLICE_QUALITY, "Dana", "accepted"))
    # A torn last line (a writer killed mid-append) is ignored.
    with open(next(tmp_path.glob("journal-*.jsonl")), "a") as f:
        f.write('{"kind": "decided", "t"')
    events = read_selection_events(tmp_path)
    rec = fold_selection(events)
    assert rec.selections[1].trial_id == "t1" and rec.selections[1].metric == 0.5
    assert rec.job_ended(1, JobRole.RERUN).ok and rec.last_job(1, JobRole.RERUN).ok
    assert [e.data.outcome for e in events if e.kind.value == "disposed"] == [Outcome.HOLD_SLICE_QUALITY]
    assert rec.decisions[1][0].by == "Dana"


def test_a_selection_file_is_the_fact_and_a_final_claim_fixes_the_current_selection(tmp_path):
    store = SelectionStore(SearchDir(tmp_path))
    assert store.current() is None and store.frozen_numbers() == []
    assert store.freeze(1, {"selection": 1}) and store.freeze(2, {"selection": 2})
    assert not store.freeze(2, {"selection": 2, "other": True})  # exclusive
    assert store.frozen_numbers() == [1, 2] and store.current() == 2  # no journal event needed
    assert store.claim_final({"selection": 1})
    assert store.current() == 1  # selection 2 froze after the claim of 1 was taken: it is void


def test_a_decision_lifts_only_the_slice_hold_and_names_who_and_why():
    with pytest.raises(ValueError):
        Decided(1, "t1", Outcome.HOLD_INVALID_WINNER, "Dana", "because")
    with pytest.raises(ValueError):
        Decided(1, "t1", Outcome.HOLD_SLICE_QUALITY, "", "because")


def test_a_damaged_selection_event_is_a_corrupt_record(tmp_path):
    (tmp_path / "journal-x.jsonl").write_text('{"kind": "disposed", "t": 1, "writer": "x", "seq": 1, "selection": 1, "outcome": "hold:maybe"}\n')
    with pytest.raises(CorruptRecord):
        read_selection_events(tmp_path)


# --- the batch templates --------------------------------------------------------------------------------


def _values(**kw):
    base = dict(
        job_name="parcel-r1-rerun",
        time_limit_min=10,
        output="/tmp/logs/rerun-%j.out",
        python="/usr/bin/python3",
        search_dir="/tmp/runs/r1",
        search_revision="r1",
        contract_digest="sha256:abc",
        search_id="none",
        selection=1,
        search_uid=1001,  # the job holds the search to its owner and its directory's inode
        search_inode=4325377,
    )
    return sbatch.SbatchValues(**{**base, **kw})


@pytest.mark.parametrize("template, role", [("winner_rerun", "rerun"), ("final_eval", "final")])
def test_selection_templates_render_and_run_their_command(template, role):
    script = sbatch.render(template, _values(gres="gpu:1", partition="low"))
    assert "#SBATCH --gres=gpu:1" in script and "#SBATCH --partition=low" in script
    assert f"-m parcel_hpc selection-job /tmp/runs/r1 {role} --selection 1 --owned 1001 4325377 none" in script
    cpu_only = sbatch.render(template, _values())
    assert "--gres" not in cpu_only and "--partition" not in cpu_only


def test_a_gres_that_is_not_a_gpu_request_is_refused():
    with pytest.raises(UsageError, match="gres"):
        _values(gres="gpu:1\n#SBATCH --uid=0")


def test_each_gate_gives_its_verdict_and_the_first_that_does_not_clear_names_the_hold():
    from parcel_hpc.selection.gates import Check, judge, release_outcome

    def checks(facts):
        return {j.gate: j.check for j in judge(facts)}

    ok = passing(lineage_now=True, final_matches=True, final=Comparison(0.41, 0.52, None))
    assert checks(ok) == dict.fromkeys([g.name for g in GATES], Check.PASSED) and release_outcome(checks(ok)) == Outcome.RELEASE_REGISTERED
    decided = replace(ok, slices=FAILED_SLICE, decided=frozenset({Outcome.HOLD_SLICE_QUALITY}))
    assert checks(decided)["slices"] is Check.DECIDED and release_outcome(checks(decided)) == Outcome.RELEASE_REGISTERED
    for change, hold in [
        ({"lineage_now": False}, "hold:invalid-winner"),
        ({"lineage_as_frozen": False}, "hold:invalid-winner"),
        ({"rerun": RerunCheck(0.45, 0.52, 0.02, 0.45)}, "hold:invalid-winner"),
        ({"rerun": None}, "hold:invalid-winner"),
        ({"slices": FAILED_SLICE}, "hold:slice-quality"),
        ({"performance": Comparison(0.60, 0.50, 0.0)}, "hold:performance"),
        ({"parity": ParityCheck(0.1, 1e-6)}, "hold:serving-parity"),
        ({"parity": ParityCheck(float("nan"), 1e-6)}, "hold:serving-parity"),
        ({"parity": ParityCheck(None, 1e-6, "KeyError: 'mean'")}, "hold:serving-parity"),  # it could not serve from its state alone
        ({"final_matches": None}, "hold:final-not-evaluated"),
        ({"final": Comparison(0.60, 0.50, 0.05)}, "hold:final-performance"),
        ({"final_matches": False, "parity": ParityCheck(0.1, 1e-6)}, "hold:serving-parity"),  # the first in GATES order
    ]:
        assert str(release_outcome(checks(replace(ok, **change)))) == hold, change


def test_a_rerun_job_is_given_the_time_of_every_training_it_does():
    from parcel_hpc.ledger import JobRole
    from parcel_hpc.selection.submit import job_time_limit_min

    assert job_time_limit_min(10, JobRole.RERUN) == 2 * 10 + 10  # the rerun and the baseline
    # a 5-fold trial's limit is 5 fold runs' (50 min): 5 fold reruns, 5 baseline folds and two refits
    assert job_time_limit_min(50, JobRole.RERUN, folds=5) == 12 * 10 + 10
    assert job_time_limit_min(50, JobRole.FINAL, folds=5) == 50  # the final job only scores


def test_a_gang_s_parts_are_replicas_only_when_every_rank_predicts_rank_0_s_probabilities_bit_for_bit():
    p = np.array([0.1, 0.7, 0.25])
    assert unlike_ranks([p, p.copy(), p.copy()]) == ()  # data-parallel: rank 0's part serves for all
    assert unlike_ranks([p, p.copy(), np.nextafter(p, 1.0), p[::-1].copy()]) == (2, 3)  # one ulp is another model
    assert unlike_ranks([p]) == ()


def test_a_gang_s_rerun_job_renders_as_a_gang_of_its_shape():
    script = sbatch.render("winner_rerun", _values(nodes=2, tasks_per_node=2, gres="gpu:2"))
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" in script and "#SBATCH --gres=gpu:2" in script
    assert "exec srun --kill-on-bad-exit=1 --cpus-per-task=" in script  # one task a rank, ended together


def test_a_local_selection_job_s_tasks_are_a_gang_and_end_together_when_one_fails(monkeypatch):
    from parcel_hpc.scheduler.local.backend import gang_task, wait_as_one
    from parcel_hpc.worker.jobenv import gang_of_job

    assert gang_task("77", 0, 1) == {}  # one task: no gang
    for name, value in gang_task("77", 1, 2).items():
        monkeypatch.setenv(name, value)
    gang = gang_of_job()  # as a trial's rank reads its place: submitit's job environment
    assert gang is not None and (gang.rank, gang.world_size, gang.local_rank, gang.job_id) == (1, 2, 1, "77")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    failing = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    wait_as_one([sleeper, failing], 0.05)  # like srun's --kill-on-bad-exit: the sleeper does not outlive it
    assert failing.returncode == 3 and sleeper.returncode == -signal.SIGKILL


def test_a_selection_job_s_own_last_words_are_told_from_a_peer_s_traceback_in_the_shared_log():
    from parcel_hpc.selection.submit import _own_words

    assert _own_words("error: rerun: rank 1 failed after step 5: RuntimeError: boom")
    assert _own_words("reject:final_partition: on rank 1: trainer code opened /data/final.json")
    assert not _own_words("reject:final_partition")  # the bare headline: its reason is on the next line
    assert not _own_words("RuntimeError: injected fault on rank 1 at step 5")
    assert not _own_words("parcel_hpc.worker.gang.FinalPartitionAsked: trainer code opened /data/final.json")
