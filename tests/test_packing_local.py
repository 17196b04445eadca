"""Packed trials on the embedded local executor: real Hydra, real submitit processes, real h5py.

A pack changes how many processes start, never what governance sees: each trial keeps its own
admission, claim, checkpoint directory, events, budget hold and result."""

import json
from dataclasses import replace

from parcel_hpc.budget import BudgetLedger
from parcel_hpc.ledger import SearchDir
from parcel_hpc.propose.specs import history_free_specs, plan_for
from parcel_hpc.testing import launch, parcel_hpc, run_trial_directly


def run(tmp_path, data_dir, rev, *overrides):
    return launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir)


def test_a_packed_search_keeps_every_trial_governed_and_gives_the_same_results(tmp_path, data_dir):
    packed = run(tmp_path, data_dir, "packed", "search.n_trials=8", "pruner=none", "hydra.launcher.pack_size=4")
    assert packed.returncode == 0, packed.stderr
    assert "packing: up to 4 trials a job, in turn, 2 jobs for 8 trials (hydra.launcher.pack_size=4)" in packed.stdout
    sd = SearchDir(tmp_path / "runs" / "packed")
    records = list(sd.records())
    assert [r.state.value for r in records] == ["completed"] * 8
    assert all(len(r.attempts) == 1 for r in records)  # nothing ran twice
    jobs = {r.attempts[0].job_id for r in records}
    assert len(jobs) == 2 and all(r.jobs == (r.attempts[0].job_id,) for r in records)  # two processes, 4 trials each
    assert len({r.attempts[0].pid for r in records}) == 2
    for r in records:  # its own claim and checkpoints, its own budget hold, settled
        own = sd.path / "checkpoints" / r.trial_id
        assert list(own.glob("claim-*.json")) and list(own.glob("ckpt-*.h5"))
        kinds = [e.kind.value for e in sd.events(r.trial_id)]
        assert kinds[:3] == ["submitted", "started", "admitted"] and kinds[-1] == "ended"
    totals = BudgetLedger(sd.path).totals()
    assert totals.reserved_gpu_hours == 0 and totals.attempts == 8 and totals.trials == 8 and totals.used_cpu_hours > 0
    launch_record = json.loads(sorted((sd.path / "launches").glob("*.json"))[-1].read_text())
    assert launch_record["packing"] == {"size": 4, "basis": "hydra.launcher.pack_size=4"}

    # The same trials one process each: bit-equal metrics (a pack shares arrays, never state).
    single = run(tmp_path, data_dir, "single", "search.n_trials=8", "pruner=none", "hydra.launcher.pack_size=1")
    assert single.returncode == 0, single.stderr
    alone = {r.trial_id: r for r in SearchDir(tmp_path / "runs" / "single").records()}
    assert len({r.attempts[0].job_id for r in alone.values()}) == 8
    assert {r.trial_id: r.metric for r in records} == {t: r.metric for t, r in alone.items()}

    # Reconcile splits each process's hours between its trials and the pack's own start-up, exactly.
    res = parcel_hpc(["reconcile", str(sd.path), "--json"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["campaigns"][0]
    assert out["flags"] == [] and out["complete"]
    trials = [a for a in out["attempts"] if a["trial_id"]]
    overhead = [a for a in out["attempts"] if not a["trial_id"]]
    assert len(trials) == 8 and len(overhead) == 2 and all(a["ledger_how"] == "start-up and gaps" for a in overhead)
    assert {a["job_id"] for a in overhead} == jobs


def test_a_packed_attempt_stops_at_its_own_limit_and_resumes_after_the_others(tmp_path, data_dir):
    """The job's limit covers the pack; each trial still has its own: the first trial reaches it,
    checkpoints, lets the second run, then resumes where it stopped."""
    res = run(tmp_path, data_dir, "limit", "search.n_trials=0", "pruner=none")
    assert res.returncode == 0, res.stderr
    sd = SearchDir(tmp_path / "runs" / "limit")
    cfg = {
        "snapshot": {"path": str(data_dir / "parcels.h5")},
        "split": {"path": str(data_dir / "split-group_r8.json")},
        "image": {"kind": "computed"},
        "checkpoint": {"dir": str(sd.path / "checkpoints"), "every_steps": 10, "keep_last": 2},
    }
    plans = []
    for spec in history_free_specs(sd.contract(), 0, 2):
        sd.write_spec(spec)
        plans.append(plan_for(spec, cfg, sd.contract(), sd.path))
    # 82 steps of 0.05 s: about 4 s of training against a 3 s limit for the first trial.
    slow = replace(plans[0], step_seconds=0.05, time_limit_min=0.05)
    done = run_trial_directly([slow, plans[1]])
    assert done.returncode == 0, done.stderr
    first, second = sd.record(slow.trial_id), sd.record(plans[1].trial_id)
    assert first.state.value == "completed" and second.state.value == "completed", (first, second)
    assert [a.how.value for a in first.attempts] == ["interrupted", "completed"] and first.attempts[0].cause.value == "timeout"
    assert first.attempts[1].resumed_from == first.attempts[0].step > 0
    assert first.attempts[0].ended <= second.attempts[0].started <= second.attempts[0].ended <= first.attempts[1].started
    assert len(second.attempts) == 1
