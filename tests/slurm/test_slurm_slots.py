"""Slots on the real dev SLURM cluster (``hydra.launcher.dispatch=slots``): array tasks that take
their trials, and for TPE make the proposals themselves, with no launcher following them; a slot
preempted mid-trial is requeued and resumes it; a slot killed for good hands its trial on, counted
once."""

import json
import time

import pytest

from parcel_hpc.ledger.store import SearchDir
from parcel_hpc.scheduler.slurm.calls import MIN_ROUND_S
from parcel_hpc.testing import finish, launch, parcel_hpc, start_launch
from parcel_hpc.testing.slots import taken_longest_first

from .cluster import PREEMPTOR, preempt, sh, wait_for, what_the_cluster_says

pytestmark = pytest.mark.slurm

SLURM = ("hydra/launcher=submitit_slurm", "hydra.launcher.dispatch=slots")
TPE = ("sampler=tpe", "sampler.n_startup_trials=2")


def overrides(tmp_path, rev, *more):
    return [*SLURM, f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *more]


def checkpointed(sd: SearchDir, tid: str, step: int):
    """The node running ``tid`` once it has saved a checkpoint at or past ``step``."""

    def check():
        ck = sorted((sd.path / "checkpoints" / tid).glob("ckpt-*.h5"))
        started = [e for e in sd.events(tid) if e.kind.value == "started"] if (sd.trial_dir(tid) / "spec.json").exists() else []
        return (started[-1].data.job_id, started[-1].data.node) if ck and int(ck[-1].stem.split("-")[1]) >= step and started else None

    return wait_for(check, 180, f"{tid} to checkpoint at step >= {step}")


def all_finished(sd: SearchDir, n: int, rev: str, timeout: float) -> None:
    try:
        wait_for(lambda: len(sd.trial_ids()) == n and all(sd.record(t).state.is_finished() for t in sd.trial_ids()), timeout, "every trial to finish")
    except AssertionError as exc:
        ledger = {t: [f"{e.kind.value}@{getattr(e.data, 'job_id', '')}" for e in sd.events(t)] for t in sd.trial_ids()}
        logs = "".join(f.read_text()[-3000:] for f in sorted((sd.path / "submitit").rglob("*_log.err")))
        raise AssertionError(f"{exc}\nledger: {ledger}\n{what_the_cluster_says(f'parcel-{rev}')}\nworker log tail:\n{logs}") from None


def reconciled(sd: SearchDir) -> dict | None:
    out = parcel_hpc(["reconcile", str(sd.path), "--json"])
    return json.loads(out.stdout)["campaigns"][0] if out.returncode == 0 else None


def test_detached_tpe_slots_propose_alone_and_a_preempted_slot_resumes_its_trial(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-slotpre", PREEMPTOR]
    args = overrides(tmp_path, "slotpre", *TPE, "search.n_trials=4", "pruner=none", "search.wait=false", "resources.gpus=4", "train.step_seconds=0.15")
    res = launch([*args, "hydra.launcher.array_parallelism=2"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    left = time.time()  # the launcher has gone: the slots propose from here on
    assert "by the slot itself" in res.stdout
    sd = SearchDir(tmp_path / "runs" / "slotpre")
    job, node = checkpointed(sd, "t0000", 10)
    preempt(node)
    all_finished(sd, 4, "slotpre", 300)
    records = {t: sd.record(t) for t in sd.trial_ids()}
    assert all(r.state.value == "completed" for r in records.values()), {t: r.state for t, r in records.items()}
    first = records["t0000"]
    assert [a.how.value for a in first.attempts] == ["interrupted", "completed"] and first.attempts[0].cause.value == "preempted"
    assert first.attempts[1].resumed_from >= 10 and first.attempts[1].job_id == job  # the requeued slot resumed it first
    assert all(len(r.attempts) == 1 for t, r in records.items() if t != "t0000")
    slot_jobs = {s["job_id"] for s in sd.slot_records()}
    assert {a.job_id for r in records.values() for a in r.attempts} <= slot_jobs and len(slot_jobs) == 2
    made = [json.loads(sd.proposal_path(k).read_text()) for k in sd.proposal_numbers()]
    assert len(made) == 4 and any(m["at"] > left for m in made)  # proposed with no launcher alive
    assert parcel_hpc(["proposals", str(sd.path), "--replay"]).returncode == 0
    # The same first proposal (told nothing, drawn from the search seed), uninterrupted on the local executor.
    ref = launch([f"search.root={tmp_path / 'runs'}", "search.revision=slotpre-ref", *TPE, "search.n_trials=1", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert ref.returncode == 0, ref.stderr[-2000:]
    reference = SearchDir(tmp_path / "runs" / "slotpre-ref").record("t0000")
    assert reference.spec.params == first.spec.params and first.metric == reference.metric

    out = wait_for(lambda: (c := reconciled(sd)) and c["complete"] and not c["flags"] and c, 120, "a reconciliation without flags")
    assert out["waste_hours"]["preemption"] > 0


def test_a_slot_killed_for_good_hands_its_trial_on_counted_once(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-slotkill")
    args = overrides(
        tmp_path,
        "slotkill",
        "search.n_trials=4",
        "pruner=none",
        "resources.gpus=0",
        "train.step_seconds=0.3",
        "train.steps=41",
        "hydra.launcher.array_parallelism=2",
        "+hydra.launcher.additional_parameters.no_requeue=true",
    )
    proc = start_launch(args, cwd=tmp_path, data_dir=data_dir)
    sd = SearchDir(tmp_path / "runs" / "slotkill")
    job, _ = checkpointed(sd, "t0000", 10)
    sh("scancel", job)
    res = finish(proc, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    records = {t: sd.record(t) for t in sd.trial_ids()}
    assert len(records) == 4 and all(r.state.value == "completed" for r in records.values()), {t: r.state for t, r in records.items()}
    killed = records["t0000"]
    # sacct may not say CANCELLED yet when the follower finds the job gone: then it is resolved lost
    assert [a.how.value for a in killed.attempts] == ["lost", "completed"] and killed.attempts[0].cause.value in ("cancelled", "lost")
    slot_jobs = {s["job_id"] for s in sd.slot_records()}
    assert killed.jobs[0] in slot_jobs and killed.jobs[-1] not in slot_jobs  # its retry ran in a job of its own
    assert killed.attempts[1].resumed_from >= 10
    assert all(len(r.attempts) == 1 for t, r in records.items() if t != "t0000")  # the killed slot's queue moved on


def test_tpe_in_slots_by_default_follows_every_trial_to_its_end(tmp_path, data_dir, cluster_guard):
    """``dispatch=auto`` (the default) runs a learning sampler in slots; the launch ends only once the
    last trial a slot proposed has ended (a launch once left while two still ran)."""
    _, names = cluster_guard
    names.append("parcel-slottpe")
    args = [
        "hydra/launcher=submitit_slurm",
        f"search.root={tmp_path / 'runs'}",
        "search.revision=slottpe",
        *TPE,
        "search.n_trials=9",
        "hydra.launcher.array_parallelism=3",
        "resources.gpus=1",
    ]
    began = time.time()
    res = launch(args, cwd=tmp_path, data_dir=data_dir)
    wall = time.time() - began
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "by the slot itself" in res.stdout and "slots: up to 3 jobs" in res.stdout, res.stdout[-3000:]
    # What it asked the scheduler is reported, and squeue is asked at most once a follow round.
    assert "scheduler calls by this launch:" in res.stdout
    asked = SearchDir(tmp_path / "runs" / "slottpe").launches()[-1]["scheduler_calls"]
    assert asked["sbatch"] >= 1 and 1 <= asked["squeue"] <= wall / MIN_ROUND_S + 2, (asked, wall)
    sd = SearchDir(tmp_path / "runs" / "slottpe")
    records = {t: sd.record(t) for t in sd.trial_ids()}  # read at once: the launch has returned
    assert len(records) + len(sd.launches()[-1]["duplicates"]) == 9
    assert all(r.state.is_finished() and len(r.attempts) == 1 for r in records.values()), {t: r.state for t, r in records.items()}
    assert sorted(sd.launches()[-1]["dispatched"]) == sorted(records)  # the launch record follows every trial the slots proposed
    assert {r.jobs[0] for r in records.values()} <= {s["job_id"] for s in sd.slot_records()} and len(sd.slot_records()) <= 3
    assert parcel_hpc(["proposals", str(sd.path), "--replay"]).returncode == 0


def test_two_launchers_on_one_search_share_its_slots_each_trial_once(tmp_path, data_dir, cluster_guard):
    _, names = cluster_guard
    names.append("parcel-slottwo")
    args = overrides(tmp_path, "slottwo", "search.n_trials=12", "pruner=none", "resources.gpus=0", "hydra.launcher.array_parallelism=2")
    first, second = (start_launch(args, cwd=tmp_path, data_dir=data_dir) for _ in range(2))
    for res in (finish(first, timeout=600), finish(second, timeout=600)):
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sd = SearchDir(tmp_path / "runs" / "slottwo")
    records = {t: sd.record(t) for t in sd.trial_ids()}
    assert len(records) == 12 and all(r.state.is_finished() and len(r.attempts) == 1 and len(r.jobs) == 1 for r in records.values())
    slot_jobs = {s["job_id"] for s in sd.slot_records()}
    assert {r.jobs[0] for r in records.values()} <= slot_jobs
    assert len({s["launch_id"] for s in sd.slot_records()}) <= 2 and not sd.queued()


def test_unequal_trials_run_longest_first_and_a_trial_that_fits_no_slot_waits_for_a_fresh_one(tmp_path, data_dir, cluster_guard):
    """One slot at a time. lr scales each step's sleep (train.step_seconds_param), so 0.1 trains about
    10x longer than 0.01: from the journals, once peers had finished the slot took the longest expected
    trial first. Then ``pack_size=1``: a slot's job is one trial's time limit, so after its first
    trial no other fits the time it has left, and each waits for a fresh slot rather than starting to be cut short."""
    _, names = cluster_guard
    names += ["parcel-slotlong", "parcel-slotfit"]
    unequal = ("lr=choice(0.01,0.1)", "train.step_seconds=1.0", "train.step_seconds_param=lr", "pruner=none", "train.steps=20", "resources.gpus=0")
    res = launch(
        overrides(tmp_path, "slotlong", *unequal, "search.n_trials=8", "hydra.launcher.array_parallelism=1"),
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sd = SearchDir(tmp_path / "runs" / "slotlong")
    records = list(sd.records())
    assert len(records) == 8 and all(r.state.value == "completed" and len(r.attempts) == 1 for r in records)
    assert len(sd.slot_records()) == 1 and {r.jobs[0] for r in records} == {sd.slot_records()[0]["job_id"]}
    assert {r.spec.params["lr"] for r in records} == {0.01, 0.1}
    early, reordered = taken_longest_first(sd)
    assert not early and reordered, early
    # The admins' view: sacct's time of the slot's job is its trials' attempts and one line of start-up and gaps.
    recon = wait_for(lambda: (out := reconciled(sd)) and out["complete"] and out, 120, "a complete reconciliation")
    assert not recon["flags"], recon["flags"]
    lines = recon["attempts"]
    assert sorted(l["trial_id"] for l in lines if l["trial_id"]) == sorted(r.trial_id for r in records)
    overhead = [l for l in lines if not l["trial_id"]]
    assert len(overhead) == 1 and overhead[0]["ledger_how"] == "start-up and gaps" and overhead[0]["elapsed_s"] >= 0

    res = launch(
        overrides(tmp_path, "slotfit", "search.n_trials=3", "pruner=none", "resources.gpus=0", "hydra.launcher.pack_size=1"), cwd=tmp_path, data_dir=data_dir
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sd = SearchDir(tmp_path / "runs" / "slotfit")
    records = list(sd.records())
    assert len(records) == 3 and all(r.state.value == "completed" and len(r.attempts) == 1 for r in records)
    limit = int(sd.contract()["resources"]["time_limit_min"])
    assert len(sd.slot_records()) == 3 and {s["minutes"] for s in sd.slot_records()} == {limit}  # one trial a slot
    assert len({r.jobs[0] for r in records}) == 3

    def limits():  # what the scheduler was asked for, once slurmdbd has filed all three
        rows = sh("sacct", "-n", "-X", "-P", "-o", "JobID,TimelimitRaw", "-j", ",".join(r.jobs[0] for r in records)).split()
        return {row.split("|")[1] for row in rows} if len(rows) == 3 else None

    assert wait_for(limits, 60, "sacct to file the three slots") == {str(limit)}


def test_cancelling_a_detached_slot_search_ends_its_pending_slots(tmp_path, data_dir, cluster_guard):
    """The slots of a detached TPE launch wait in the queue (``--begin`` an hour on): no launcher is
    left to withdraw them, so ``cancel`` ends them itself rather than leave each to start and leave."""
    _, names = cluster_guard
    names.append("parcel-slotcancel")
    args = overrides(tmp_path, "slotcancel", *TPE, "search.n_trials=4", "search.wait=false", "resources.gpus=0", "hydra.launcher.array_parallelism=2")
    res = launch([*args, "+hydra.launcher.additional_parameters.begin=now+3600"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    sd = SearchDir(tmp_path / "runs" / "slotcancel")
    jobs = {s["job_id"] for s in sd.slot_records()}
    assert len(jobs) == 2 and not sd.trial_ids()  # both pending, nothing proposed yet
    out = parcel_hpc(["cancel", str(sd.path), "--reason", "wrong space"])
    assert out.returncode == 0 and "2 slots running no trial were ended" in out.stdout, out.stdout + out.stderr
    assert not [n for n in sh("squeue", "-h", "-o", "%j").split() if n.startswith("parcel-slotcancel")]
    assert not sd.trial_ids()  # no slot started to propose
