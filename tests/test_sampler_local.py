"""A search that learns, end to end on the embedded local executor: Hydra's sweep grammar on the
command line, TPE proposals made as slots free, each recorded and replayed exactly."""

import json
import os
import re
import time

import pytest
import yaml

from parcel_hpc.config import CONF_DIR
from parcel_hpc.governance.contract import Contract, load_contract
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import AttemptEnd, SearchDir, TrialRecord, TrialSpec, TrialState
from parcel_hpc.ledger.events import Ended
from parcel_hpc.propose import proposals as proposals_module
from parcel_hpc.propose import samplers
from parcel_hpc.propose.learning import Told, ask, proposal_seed, told_of
from parcel_hpc.propose.proposals import Proposer
from parcel_hpc.propose.proposals import load as load_proposal
from parcel_hpc.propose.space import normalize
from parcel_hpc.propose.specs import history_free_params, in_frozen_form
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch
from parcel_hpc.testing.trainers import SLOW_PARAMS_ENV

LR = "lr=tag(log,interval(0.003,0.3))"
TPE = ["sampler=tpe", "sampler.n_startup_trials=4"]
SPACE_R4 = yaml.safe_load((CONF_DIR / "space" / "space_r4.yaml").read_text())["params"]


def run(tmp_path, data_dir, *overrides, rev="tpe-r1", **kw):
    return launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir, **kw)


def proposals(path, *args):
    return parcel_hpc(["proposals", str(path), *args])


def test_tpe_search_from_the_command_line_grammar_replays_every_proposal(tmp_path, data_dir):
    res = run(tmp_path, data_dir, *TPE, LR, "hidden=choice(0,16,32)", "search.n_trials=12", "hydra.launcher.parallelism=2")
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "tpe-r1")
    contract = load_contract(search.path)
    assert contract["sampler"]["name"] == "tpe" and contract["sampler"]["revision"].startswith("optuna ")
    assert contract["sampler"]["options"]["n_startup_trials"] == 4 and contract["sampler"]["options"]["constant_liar"] is True
    space = contract["space"]["params"]
    assert space["lr"] == {"type": "float", "low": 0.003, "high": 0.3, "log": True, "step": None}
    assert space["hidden"]["values"] == [0, 16, 32] and space["batch_size"]["values"] == [32, 64, 128]  # the rest from space_r4
    assert contract["space"]["digest"].startswith("sha256:")

    assert search.proposal_numbers() == list(range(12))
    records = {r.trial_id: r for r in search.records()}
    assert all(r.state.is_finished() for r in records.values())
    for k in search.proposal_numbers():
        record = json.loads(search.proposal_path(k).read_text())
        told_ids = [t["trial_id"] for t in record["told"]]
        assert told_ids == sorted(t for t in records if int(t[1:]) < k)  # every earlier trial, in order
        if f"t{k:04d}" in records:
            origin = records[f"t{k:04d}"].spec.origin
            assert origin == {"sampler": "tpe", "proposal": k, "history_digest": record["history_digest"], "told": len(told_ids)}
            assert records[f"t{k:04d}"].spec.params == record["params"]
    # asynchronous: later proposals were told results, and some trials were still running when told
    told_states = [t["told"] for k in range(4, 12) for t in json.loads(search.proposal_path(k).read_text())["told"]]
    assert {"complete", "pruned"} & set(told_states) and "running" in told_states

    out = proposals(search.path, "--replay", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.json()["replayed"] == 12 and out.json()["first_difference"] is None
    exported = parcel_hpc(["export", str(search.path), "--format", "jsonl"])
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [(r["proposed_by"], r["proposal"]) for r in rows] == [("tpe", int(r["trial_id"][1:])) for r in rows]

    # a record edited by hand: the replay names the first proposal that differs, exit 1
    path = search.proposal_path(7)
    edited = json.loads(path.read_text())
    edited["params"]["lr"] = 0.1234
    os.chmod(path, 0o644)
    path.write_text(json.dumps(edited))
    out = proposals(search.path, "--replay")
    assert out.returncode == 1
    assert "proposal 7 (t0007) differs" in out.stdout and "lr: recorded 0.1234, re-derived" in out.stdout

    # the same search continued: two more proposals, nothing finished runs again
    res = run(tmp_path, data_dir, *TPE, LR, "hidden=choice(0,16,32)", "search.n_trials=14")
    assert res.returncode == 0, res.stderr
    assert search.proposal_numbers() == list(range(14))
    assert all(len(r.attempts) == 1 for r in search.records())

    # a changed space is another search
    res = run(tmp_path, data_dir, *TPE, "lr=tag(log,interval(0.001,0.3))", "hidden=choice(0,16,32)", "search.n_trials=14")
    assert res.returncode == 3 and res.stdout.startswith("reject:space"), res.stdout + res.stderr


def test_a_slow_trial_does_not_hold_back_the_next_proposals(tmp_path, data_dir):
    """The first trial trains ~20 s; the other slot goes on proposing and finishing trials meanwhile."""
    spec = samplers.from_config({"name": "tpe", "n_startup_trials": 4})
    space = normalize({}, [LR, "hidden=choice(0,16,32,64)", "l2=tag(log,interval(1e-5,1e-2))", "batch_size=choice(32,64,128)"])
    first, _ = ask(spec, space, proposal_seed(0, 0), [], {})
    res = run(
        tmp_path,
        data_dir,
        *TPE,
        "trainer.target=parcel_hpc.testing.trainers:SlowForSomeParams",
        "pruner=none",
        "search.n_trials=10",
        "hydra.launcher.parallelism=2",
        env={SLOW_PARAMS_ENV: json.dumps(first)},
        rev="slow-r1",
    )
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "slow-r1")
    records = {r.trial_id: r for r in search.records()}
    slow = records["t0000"]
    assert slow.spec.params == first
    slow_ended = slow.attempts[-1].ended
    others = [r for tid, r in records.items() if tid != "t0000"]
    assert len(others) >= 8
    assert all(r.attempts[-1].ended < slow_ended for r in others)  # all finished while the straggler trained
    made_meanwhile = [json.loads(search.proposal_path(k).read_text()) for k in search.proposal_numbers() if k >= 2]
    assert all(m["at"] < slow_ended for m in made_meanwhile)
    told_running = [t["told"] for m in made_meanwhile for t in m["told"] if t["trial_id"] == "t0000"]
    assert told_running and set(told_running) == {"running"}  # told what was known: it was still running
    assert proposals(search.path, "--replay").returncode == 0


def test_random_search_replays_from_seed_and_index(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "search.n_trials=3", rev="random-r1")
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "random-r1")
    assert search.spec("t0002").origin == {"sampler": "random", "index": 2}
    out = proposals(search.path, "--replay", "--json")
    assert out.returncode == 0 and out.json()["replayed"] == 3

    # a search frozen before samplers were pinned (its space as the group wrote it, no sampler) is
    # the same search to this version: a relaunch continues it, drawing the same trials
    contract = load_contract(search.path)
    legacy = Contract({**{k: v for k, v in contract.fields.items() if k != "sampler"}, "space": {"revision": "space-r4", "params": SPACE_R4}})
    assert in_frozen_form(contract, legacy).digest == legacy.digest
    assert history_free_params(legacy, 0, 3) == history_free_params(contract, 0, 3) == [search.spec(t).params for t in search.trial_ids()]
    tpe = Contract({**contract.fields, "sampler": samplers.from_config({"name": "tpe"}).to_json()})
    assert in_frozen_form(tpe, legacy) is tpe  # another sampler is another search: refused as before


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["sampler=tpe", "+sampler.n_startup=3"], "sampler.n_startup is not an option of sampler=tpe"),
        (["sampler=hyperband"], "sampler/hyperband"),
        (["lr=tag(log,interval(0,1))"], "lr is log-scaled, so its bounds must be positive"),
        (["hidden=choice()"], "hidden"),
        (["lr=tag(log,interval(0.1"], "malformed"),
        (["search.seed=1,2"], "search.seed is not a trial parameter"),
        (["sampler=tpe", "sampler.n_startup_trials=-1"], "sampler.n_startup_trials=-1 is out of range; give a whole number in 0..1000000"),
    ],
)
def test_bad_sampler_or_grammar_is_one_line_before_anything_is_written(tmp_path, data_dir, overrides, message):
    res = run(tmp_path, data_dir, *overrides, rev="bad-r1")
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
    assert not (tmp_path / "runs" / "bad-r1").exists()


def _record(k, state, metric=None, **kw):
    spec = TrialSpec(f"t{k:04d}", k, {"x": k}, 1, "sha256:" + "0" * 64, "sha256:c", "sha256:i", {}, {"sampler": "tpe", "proposal": k})
    return TrialRecord(spec, state, metric=metric, **kw)


def test_told_results_quarantined_and_refused_trials_are_withdrawn():
    records = [
        _record(3, TrialState.COMPLETED, 0.5),
        _record(0, TrialState.PRUNED, milestone=20, last_value=0.7),
        _record(1, TrialState.FAILED),
        _record(2, TrialState.QUARANTINED),
        _record(4, TrialState.RUNNING),
        _record(5, TrialState.QUEUED),
        _record(6, TrialState.REJECTED),
        _record(7, TrialState.CANCELLED),
        _record(8, TrialState.COMPLETED, 0.4, invalid_metrics=True),
    ]
    told = told_of(records)
    assert [(t.trial_id, t.told) for t in told] == [
        ("t0000", Told.PRUNED),
        ("t0001", Told.FAILED),
        ("t0003", Told.COMPLETE),
        ("t0004", Told.RUNNING),
        ("t0005", Told.RUNNING),
    ]
    assert (told[0].value, told[0].step) == (0.7, 20) and told[2].value == 0.5 and told[2].proposal == 3


def test_two_launchers_on_one_search_never_propose_twice_for_one_slot(tmp_path, data_dir):
    args = [f"search.root={tmp_path / 'runs'}", "search.revision=two-r1", *TPE, "search.n_trials=10", "hydra.launcher.parallelism=2"]
    first, second = (start_launch(args, cwd=tmp_path, data_dir=data_dir) for _ in range(2))
    for res in (finish(first), finish(second)):
        assert res.returncode == 0, res.stdout + res.stderr
    search = SearchDir(tmp_path / "runs" / "two-r1")
    assert search.proposal_numbers() == list(range(10))  # each proposal made once: numbered, created exclusively
    made = [json.loads(search.proposal_path(k).read_text()) for k in range(10)]
    by = {m["trial_id"]: m["launch_id"] for m in made}
    assert len(set(by.values())) == 2  # both launchers proposed
    for k, m in enumerate(made):
        # A slot proposes only when it is free: the other 3 slots (2 a launcher) run at most 3 trials then. Which
        # launcher's slot runs a proposal is not fixed: between its proposer queueing it and taking it, a free slot of
        # the other launcher may take it (``launch/slot._take_proposed``), and the proposer then proposes again.
        assert sum(t["told"] == "running" for t in m["told"]) <= 3
        assert [t["trial_id"] for t in m["told"]] == [f"t{j:04d}" for j in range(k)]  # told every earlier proposal
    records = list(search.records())
    assert len(records) == 10 and all(r.state.is_finished() and len(r.attempts) == 1 and len(r.jobs) == 1 for r in records)
    assert proposals(search.path, "--replay").returncode == 0


def test_a_refused_budget_reservation_stops_the_proposals(tmp_path, data_dir):
    res = run(tmp_path, data_dir, *TPE, "search.n_trials=2", rev="budget-r1")
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "budget-r1")
    proposer = Proposer(search, load_contract(search.path), 6, "test")
    made = proposer.propose(lambda: list(search.records()))
    assert made.spec.trial_id == "t0002" and proposer.remaining() == 3
    # what its worker writes when the budget journal refuses the attempt's reservation (worker/attempt.py)
    search.writer("t0002", "attempt").ended(1, Ended(AttemptEnd.BUDGET_EXHAUSTED, outcome=Outcome.HOLD_BUDGET, reason="hold:budget: the cap is spent"))
    assert search.record("t0002").state is TrialState.BUDGET_EXHAUSTED
    assert proposer.propose(lambda: list(search.records())) is None  # the slot it freed gets no proposal
    assert "budget" in proposer.stopped and proposer.remaining() == 0 and search.proposal_numbers() == [0, 1, 2]


def test_a_proposal_whose_trial_appeared_after_the_records_were_read_is_told_as_running(tmp_path, data_dir):
    res = run(tmp_path, data_dir, *TPE, "search.n_trials=2", rev="race-r1")
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "race-r1")
    contract = load_contract(search.path)
    before = list(search.records())  # what another slot read before this proposal's trial spec was written
    made = Proposer(search, contract, 4, "a").propose(lambda: list(search.records()))
    assert made.spec.trial_id == "t0002" and (search.trial_dir("t0002") / "spec.json").exists()
    made = Proposer(search, contract, 4, "b").propose(lambda: before)
    told = {t.trial_id: t.told for t in load_proposal(search, 3).told}
    assert made.spec.trial_id == "t0003" and told == {"t0000": told["t0000"], "t0001": told["t0001"], "t0002": Told.RUNNING}


def test_proposals_are_drawn_one_at_a_time_and_a_dead_askers_lease_is_drawn_over(tmp_path, data_dir, monkeypatch):
    res = run(tmp_path, data_dir, *TPE, "search.n_trials=2", rev="lease-r1")
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "runs" / "lease-r1")
    contract = load_contract(search.path)
    proposals_dir = search.path / "proposals"
    assert sorted(p.name for p in proposals_dir.iterdir()) == ["000000.json", "000001.json"]  # no lease left behind
    # Another asker is drawing proposal 2: this one waits for its record rather than drawing it too.
    assert search.lease_proposal(2, {"launch_id": "other"})
    monkeypatch.setattr(proposals_module, "LEASE_S", 0.5)
    asker = Proposer(search, contract, 4, "b")
    assert asker.propose(lambda: list(search.records())) is None and asker.waiting == 2 and search.proposal_numbers() == [0, 1]
    # That asker died: its lease stays as it was for LEASE_S by this asker's clock, and proposal 2 is drawn over it.
    began = time.monotonic()
    asker.await_record(2, 0.05)
    assert time.monotonic() - began >= 0.4
    made = asker.propose(lambda: list(search.records()))
    assert made.spec.trial_id == "t0002" and asker.waiting is None
    assert sorted(p.name for p in proposals_dir.iterdir()) == ["000000.json", "000001.json", "000002.asking", "000002.json"]
    assert json.loads((proposals_dir / "000002.asking").read_text())["launch_id"] == "other"  # never removed by another: it says whose it was
    # A lease taken again (a live asker, a new file) restarts the wait: only one left unchanged is overdue.
    assert search.lease_proposal(3, {"launch_id": "other"})
    assert asker.propose(lambda: list(search.records())) is None and asker.waiting == 3
    time.sleep(0.3)
    os.unlink(proposals_dir / "000003.asking")
    assert search.lease_proposal(3, {"launch_id": "third"})
    time.sleep(0.3)
    assert asker.propose(lambda: list(search.records())) is None and asker.waiting == 3  # 0.6 s since the first, 0.3 s since this one


def test_the_release_packet_names_the_proposal_and_its_history():
    from parcel_hpc.governance.contract import Contract
    from parcel_hpc.release.packet import _proposed_by

    sampler = samplers.from_config({"name": "tpe"}).to_json()
    contract = Contract(
        {
            "snapshot_digest": "s",
            "split_digest": "p",
            "metric_revision": "m",
            "search_revision": "r",
            "image_digest": "i",
            "sampler": sampler,
            "space": {"params": {}, "digest": "sha256:x"},
        }
    )
    spec = _record(7, TrialState.COMPLETED, 0.5).spec
    spec = TrialSpec(**{**spec.to_json(), "origin": {"sampler": "tpe", "proposal": 7, "history_digest": "sha256:h", "told": 7}})
    proposed = _proposed_by(contract, spec)
    assert (proposed["sampler"], proposed["proposal"], proposed["told"], proposed["history_digest"]) == ("tpe", 7, 7, "sha256:h")
    assert proposed["revision"] == sampler["revision"] and proposed["options"]["n_startup_trials"] == 10 and proposed["space_digest"] == "sha256:x"


def test_hydra_sweeper_params_then_the_command_line_each_win_per_parameter(tmp_path, data_dir):
    configured = "+hydra.sweeper.params={hidden:'choice(0,16)',lr:'tag(log,interval(0.01,0.1))'}"
    res = run(tmp_path, data_dir, configured, "hidden=choice(1,2,3)", "search.dry_run=true", "search.n_trials=8", rev="dry-r1")
    assert res.returncode == 0, res.stderr
    hidden = [int(v) for v in re.findall(r"hidden=(\d+)", res.stdout)]
    lr = [float(v) for v in re.findall(r"lr=([0-9.e-]+)", res.stdout)]
    assert len(hidden) == len(lr) == 8 and set(hidden) <= {1, 2, 3} and all(0.01 <= x <= 0.1 for x in lr)
    assert not (tmp_path / "runs" / "dry-r1").exists()  # a dry run writes nothing
    res = run(tmp_path, data_dir, *TPE, "search.dry_run=true", "search.n_trials=8", rev="dry-r1")
    assert res.returncode == 0, res.stderr
    assert "proposing up to 8 trials by tpe(" in res.stdout and "worst case:" in res.stdout
    assert not (tmp_path / "runs" / "dry-r1").exists()
