"""A trial of 2 nodes x 2 ranks on the dev cluster (issue 50): examples/parcel_loop's loop,
data-parallel (DistributedDataParallel over gloo, on the CPU), one SLURM job of 4 tasks started by
srun. The uninterrupted gang is one attempt of one job over 2 nodes; the same gang preempted mid-run
(a high-priority job on both its nodes) checkpoints every rank at one step, is requeued whole and
ends with the uninterrupted gang's metric bit for bit. A node set DOWN under a running gang ends its
job; the next attempt says the first was a node failure and resumes the gang from its last complete
checkpoint: counted once, as one trial's interruption."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from reference import EXAMPLES, hf_checkpoint, hf_weights, lightning_weights, same_tensors

from parcel_hpc.budget import BudgetLedger
from parcel_hpc.checkpoints import format as ckpt_format
from parcel_hpc.ledger import AttemptEnd, Cause, JobRole, SearchDir, Started, TrialState
from parcel_hpc.scheduler.slurm.steps import cpu_seconds
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.testing import launch, parcel_hpc

from .cluster import PREEMPTOR, preempt, sh, wait_for

pytestmark = pytest.mark.slurm  # the cluster's one worker (tests/conftest.py): no test beside it sets nodes down or restarts daemons
pytest.importorskip("torch")

GANG = [
    "hydra/launcher=submitit_slurm",
    "trainer.target=parcel_loop:train_ddp",
    "search.n_trials=1",
    "~space.params.hidden",
    "~space.params.l2",
    "batch_size=choice(32)",
    "lr=choice(0.03)",
    "train.steps=80",
    "pruner=none",
    "resources.gpus=0",
    "resources.nodes=2",
    "resources.tasks_per_node=2",
]


def _launch(root, data_dir, revision, *extra, base=GANG):
    res = launch([f"search.root={root}", f"search.revision={revision}", *base, *extra], cwd=root, data_dir=data_dir, env={"PYTHONPATH": str(EXAMPLES)})
    assert res.returncode == 0, res.stderr[-3000:]
    return SearchDir(root / revision)


def _committed(search: SearchDir) -> int:
    steps = [int(m) for p in (search.path / "checkpoints" / "t0000").glob("ckpt-*.manifest.json") if (m := re.match(r"ckpt-(\d+)", p.name).group(1))]
    return max(steps, default=0)


def _nodes(search: SearchDir) -> list[str]:
    """The nodes of the trial's running job."""
    job = search.record("t0000").jobs[-1]
    return sh("scontrol", "show", "hostnames", sh("squeue", "-h", "-j", job.split("_")[0], "-o", "%N").strip()).split()


@pytest.fixture(scope="module")
def whole(tmp_path_factory, artifacts):
    """The gang uninterrupted, each rank granted one of its node's GPUs (the dev cluster's gres; the
    example trains on the CPU whatever it is granted): 4 GPUs for the job."""
    root = tmp_path_factory.mktemp("slurm-gang")
    shutil.copytree(artifacts["dir"], root / "data")
    return _launch(root, root / "data", "whole", "resources.gpus=1")


def test_a_gang_of_two_nodes_is_one_job_of_four_tasks_and_one_attempt(whole):
    record = whole.record("t0000")
    assert record.state is TrialState.COMPLETED and len(record.attempts) == 1
    job = record.attempts[0].job_id
    steps = {line.split("|")[0]: line.split("|")[1:] for line in sh("sacct", "-n", "-P", "-j", job, "-o", "JobID,NNodes,NTasks").splitlines()}
    assert steps[f"{job}.0"][:2] == ["2", "4"], steps  # srun's step: 4 ranks on 2 nodes
    manifest = json.loads((whole.path / "checkpoints" / "t0000" / "ckpt-000080.manifest.json").read_text())
    assert manifest["world_size"] == 4


def test_reconcile_shows_the_gang_s_hours_per_node_and_per_rank_adding_up_to_sacct_s(whole):
    job = whole.record("t0000").attempts[0].job_id
    alloc = sh("sacct", "-n", "-P", "-X", "-j", job, "-o", "AllocCPUS,ElapsedRaw,NodeList,AllocTRES").split("|")
    sacct_cpu_h = int(alloc[0]) * int(alloc[1]) / 3600
    assert "gres/gpu=4" in alloc[3]  # every rank's GPU, as the request
    result = json.loads(parcel_hpc(["reconcile", str(whole.path), "--json", "--wait", "60"]).stdout)
    report = result["campaigns"][0]
    assert report["flags"] == []  # 4 GPUs allocated for a gang of 4 ranks of 1: as asked
    ranks = report["ranks"]
    assert [(r["rank"], r["cpus"], r["gpus"]) for r in ranks] == [(0, 1, 1), (1, 1, 1), (2, 1, 1), (3, 1, 1)]
    assert sum(r["gpu_hours"] for r in ranks) == pytest.approx(4 * int(alloc[1]) / 3600, rel=1e-9) == report["attempts"][0]["gpu_hours"]
    nodes = sh("scontrol", "show", "hostnames", alloc[2].strip()).split()
    assert [r["node"] for r in ranks] == [nodes[0], nodes[0], nodes[1], nodes[1]]  # srun's block layout: 2 a node
    assert sum(r["cpu_hours"] for r in ranks) == pytest.approx(sacct_cpu_h, rel=1e-9)
    assert sum(a["cpu_hours"] for a in report["attempts"]) == pytest.approx(sacct_cpu_h, rel=1e-9)
    table = parcel_hpc(["reconcile", str(whole.path)], env={"COLUMNS": "250"}).stdout
    assert "per rank" in table and f"{sacct_cpu_h / 2:.4f}" in table  # a node's share
    # What the ranks used: the srun step's tasks as slurmd measured them, sacct's own TotalCPU.
    (step,) = report["steps"]
    total_cpu = sh("sacct", "-n", "-P", "-j", f"{job}.0", "-o", "TotalCPU").strip()
    assert (step["job_id"], step["run"], step["step"], step["nodes"], step["ranks"]) == (job, 0, "0", 2, 4)
    assert step["cpu_hours_used"] == pytest.approx(cpu_seconds(total_cpu) / 3600) and 0 < step["cpu_hours_used"] <= sacct_cpu_h
    assert step["cpu_use"] == pytest.approx(step["cpu_hours_used"] / sacct_cpu_h) and step["busiest_rank"] in range(4)
    assert step["busiest_node"] in nodes and step["memory_bytes"] > 0
    assert "per srun step" in table


def test_a_preempted_gang_is_requeued_whole_and_resumes_bit_equal(tmp_path, data_dir, whole, cluster_guard):
    _, names = cluster_guard
    names += ["parcel-pre", PREEMPTOR]
    search = _launch(tmp_path, data_dir, "pre", "train.step_seconds=0.15", "search.wait=false")
    wait_for(lambda: _committed(search) >= 20, 180, "the gang's checkpoint at step 20")
    preempt(",".join(_nodes(search)), "--exclusive")  # both nodes: every rank gets the signal
    wait_for(lambda: search.record("t0000").state.is_finished(), 300, "the gang to finish")
    record = search.record("t0000")
    first, *_, last = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.PREEMPTED) and 20 <= first.step < 80
    assert last.resumed_from == first.step and last.how is AttemptEnd.COMPLETED
    assert record.metric == whole.record("t0000").metric


def test_a_node_set_down_under_a_gang_is_one_interruption_and_the_gang_resumes(tmp_path, data_dir, whole, cluster_guard):
    touched, names = cluster_guard
    names += ["parcel-down"]
    search = _launch(tmp_path, data_dir, "down", "train.step_seconds=0.15", "search.wait=false")
    wait_for(lambda: _committed(search) >= 20, 180, "the gang's checkpoint at step 20")
    started = [e.data for e in search.events("t0000") if isinstance(e.data, Started)][-1]
    other = next(n for n in _nodes(search) if n != started.node)  # not rank 0's node
    touched.append(other)
    sh("scontrol", "update", f"nodename={other}", "state=down", "reason=parcel-gang-test")
    wait_for(lambda: len(search.record("t0000").attempts) >= 2, 180, "the gang's next attempt")  # on the two nodes left
    wait_for(lambda: search.record("t0000").state.is_finished(), 300, "the gang to finish")
    record = search.record("t0000")
    first, second = record.attempts
    # The node's failure ends the whole job (srun ends every task) and the scheduler requeues it. Which
    # is seen first is a race: the job ended, and the next attempt says so for the one before, which
    # never could (a reconcile names the node failure); or rank 0 sees its peer's connection close and
    # says itself that a rank was lost. Either way one interruption, resumed from the last checkpoint.
    assert (first.how, first.cause) in ((AttemptEnd.LOST, Cause.REQUEUED_BY_SCHEDULER), (AttemptEnd.INTERRUPTED, Cause.RANK_LOST)), first
    assert second.resumed_from >= 20 and second.how is AttemptEnd.COMPLETED
    assert record.metric == whole.record("t0000").metric


def test_gangs_in_a_slot_of_their_shape_run_one_after_another_and_reconcile_per_step(tmp_path, data_dir, whole):
    # search.seed=11 draws (32, 0.03), the uninterrupted gang's, a duplicate of it, then (32, 0.05).
    base = [a for a in GANG if not a.startswith(("batch_size=", "lr=", "search.n_trials=", "resources.gpus="))]
    slotted = [
        "batch_size=choice(32,16)",
        "lr=choice(0.03,0.05)",
        "resources.gpus=1",
        "search.n_trials=3",
        "search.seed=11",
        "hydra.launcher.dispatch=slots",
        "hydra.launcher.array_parallelism=1",
    ]
    search = _launch(tmp_path, data_dir, "slots", *slotted, base=base)
    records = list(search.records())
    assert [r.spec.params["lr"] for r in records] == [0.03, 0.05] and all(r.state is TrialState.COMPLETED for r in records)
    (job,) = {a.job_id for r in records for a in r.attempts}  # one slot of 2 nodes x 2 ranks ran both
    assert records[0].metric == whole.record("t0000").metric  # as the gang trained it in a job of its own
    report = json.loads(parcel_hpc(["reconcile", str(search.path), "--json", "--wait", "60"]).stdout)["campaigns"][0]
    assert report["flags"] == [] and {r["trial_id"] for r in report["ranks"]} == {"t0000", "t0002"}
    (step,) = report["steps"]  # the slot's one srun step, both trials' ranks
    assert (step["trials"], step["job_id"], step["ranks"], step["nodes"]) == ("t0000,t0002", job, 4, 2)


def test_a_search_of_two_shapes_submits_an_array_per_shape_and_charges_each_trial_its_own(tmp_path, artifacts):
    """width=8 trials as 2 nodes x 2 ranks of 1 GPU, width=4 trials as one rank of 1 GPU, in one search
    (resources.shape_by): one array per shape, each trial's job of its own shape, as sacct records it."""
    shutil.copytree(artifacts["dir"], tmp_path / "data")
    base = [o for o in GANG if not o.startswith(("resources.nodes", "resources.tasks_per_node", "search.n_trials", "lr=", "train.steps"))]
    mixed = ["search.n_trials=4", "lr=choice(0.03,0.1)", "width=choice(4,8)", "train.steps=20", "resources.gpus=1"]
    shapes = ["resources.shape_by=width", "resources.shapes={8:{nodes:2,tasks_per_node:2}}"]
    search = _launch(tmp_path, tmp_path / "data", "mixed", *mixed, *shapes, base=base)
    records = list(search.records())
    assert {int(r.spec.params["width"]) for r in records} == {4, 8} and all(r.state is TrialState.COMPLETED for r in records)
    arrays = set()
    holds = BudgetLedger.read(search.path).holds
    limit_h = float(search.contract()["resources"]["time_limit_min"]) / 60.0
    for r in records:
        (attempt,) = r.attempts
        gang = int(r.spec.params["width"]) == 8
        job = attempt.job_id
        arrays.add(job.split("_")[0])
        steps = {line.split("|")[0]: line.split("|")[1:] for line in sh("sacct", "-n", "-P", "-j", job, "-o", "JobID,NNodes,NTasks,AllocTRES").splitlines()}
        assert steps[f"{job}.0"][:2] == (["2", "4"] if gang else ["1", "1"]), steps  # srun's step: the trial's own ranks
        assert f"gres/gpu={4 if gang else 1}" in steps[job][2], steps  # every rank's GPU, allocated by the scheduler
        assert r.spec.shape.gpus == (4 if gang else 1)
        hold = holds[next(k for k in holds if k.trial_id == r.trial_id)]
        assert hold.reserved_gpu_hours == pytest.approx(r.spec.shape.gpus * limit_h, abs=1e-6)  # its own shape's worst case
    assert len(arrays) == 2  # an array's tasks share one shape: one array per shape


def test_slots_of_two_shapes_each_take_only_the_trials_of_their_shape(tmp_path, artifacts):
    """The same search in slots (hydra.launcher.dispatch=slots): slot jobs of each shape, each taking
    only queued trials of its own shape."""
    shutil.copytree(artifacts["dir"], tmp_path / "data")
    base = [o for o in GANG if not o.startswith(("resources.nodes", "resources.tasks_per_node", "search.n_trials", "lr=", "train.steps"))]
    mixed = ["search.n_trials=8", "lr=choice(0.03,0.1)", "width=choice(4,8)", "train.steps=20", "hydra.launcher.dispatch=slots"]
    shapes = ["resources.shape_by=width", "resources.shapes={8:{nodes:2,tasks_per_node:2}}"]
    search = _launch(tmp_path, tmp_path / "data", "slots", *mixed, *shapes, base=base)
    slot_jobs = {str(s["job_id"]) for s in search.slot_records()}
    records = list(search.records())
    assert {int(r.spec.params["width"]) for r in records} == {4, 8} and all(r.state is TrialState.COMPLETED for r in records)
    for r in records:
        job = r.attempts[-1].job_id
        assert job in slot_jobs
        steps = {line.split("|")[0]: line.split("|")[1:] for line in sh("sacct", "-n", "-P", "-j", job, "-o", "JobID,NNodes,NTasks").splitlines()}
        assert steps[f"{job}.0"][:2] == (["2", "4"] if r.spec.shape.is_gang else ["1", "1"]), steps  # the slot's job: its trials' shape


def test_a_gang_s_winner_reruns_as_a_gang_of_its_shape_in_one_selection_job(whole, tmp_path):
    """select on the uninterrupted gang: its rerun job is one job of 2 nodes x 2 tasks (srun's step), which
    trains the winner's configuration again as the gang did and lands on its value and weights bit for bit."""
    copy = tmp_path / "whole"  # its plan still reads the gang's own checkpoints; the selection lands in the copy
    shutil.copytree(whole.path, copy)
    record = whole.record("t0000")
    res = parcel_hpc(["select", str(copy), "--now", "--reason", "a gang's winner"], cwd=tmp_path, env={"PYTHONPATH": str(EXAMPLES)})
    assert res.returncode in (0, 3) and "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    result = json.loads((copy / "selection" / "1" / "rerun" / "result.json").read_text())
    assert result["selected_metric"] == result["artifact_metric"] == result["rerun_metric"] == record.metric
    assert result["job"]["resources"] == {"cpus": 4, "gpus": 4, "ranks": 4}
    chain = Path(result["run_dir"]) / "rerun-chain"
    assert json.loads((chain / "ckpt-000080.manifest.json").read_text())["world_size"] == 4
    trained = ckpt_format.read(whole.path / "checkpoints" / "t0000" / "ckpt-000080.rank-0003.h5").params
    rerun = ckpt_format.read(chain / "ckpt-000080.rank-0003.h5").params
    assert all(np.array_equal(rerun[k], trained[k]) for k in trained if k.startswith("model/"))
    job_id = SelectionStore(SearchDir(copy)).record().last_job(1, JobRole.RERUN).job_id
    steps = {line.split("|")[0]: line.split("|")[1:] for line in sh("sacct", "-n", "-P", "-j", job_id, "-o", "JobID,NNodes,NTasks").splitlines()}
    assert steps[f"{job_id}.0"][:2] == ["2", "4"], steps  # srun's step: the rerun's 4 ranks on 2 nodes


KEPT_GANG = [*(a for a in GANG if not a.startswith(("trainer.target=", "train.steps=", "resources.tasks_per_node="))), "train.steps=40"]
KEPT_GANG += ["resources.tasks_per_node=1"]


def _same_lightning_weights(search: SearchDir, reference: SearchDir) -> bool:
    # Each rank's own Lightning checkpoint: DDP's replicas, each equal to the reference rank's.
    return all(same_tensors(lightning_weights(search.path, 40, rank), lightning_weights(reference.path, 40, rank)) for rank in (0, 1))


def _same_hf_weights(search: SearchDir, reference: SearchDir) -> bool:
    # Rank 0's part holds the model; rank 1's its own generators, where they ended.
    return same_tensors(hf_weights(search.path, 40), hf_weights(reference.path, 40)) and hf_checkpoint(search.path, 40, 1) == hf_checkpoint(
        reference.path, 40, 1
    )


KEPT_LOOPS = {
    "lightning": ("parcel_lightning:train", "lightning", _same_lightning_weights),
    "hf": ("parcel_hf:train", "transformers", _same_hf_weights),
}


@pytest.mark.parametrize("kept", sorted(KEPT_LOOPS))
def test_a_kept_trainer_s_gang_on_two_nodes_preempted_resumes_to_the_local_gang_s_weights(kept, tmp_path, data_dir, cluster_guard):
    """examples/parcel_lightning and examples/parcel_hf unchanged as a trial of 2 nodes x 1 rank: the
    library's own DDP over srun's two tasks, preempted on both nodes, requeued whole; the gang ends with
    the weights of the same gang trained uninterrupted by the local executor (2 ranks on this machine: the
    ranks' shares and gloo's sum of two are what they are on any two hosts)."""
    target, library, same_weights = KEPT_LOOPS[kept]
    pytest.importorskip(library)
    _, names = cluster_guard
    names += [f"parcel-{kept}pre", PREEMPTOR]
    base = [*KEPT_GANG, f"trainer.target={target}"]
    search = _launch(tmp_path, data_dir, f"{kept}pre", "train.step_seconds=0.4", "search.wait=false", base=base)
    wait_for(lambda: _committed(search) >= 10, 240, f"the {kept} gang's checkpoint at step 10")
    preempt(",".join(_nodes(search)), "--exclusive")
    local = [a for a in base if not a.startswith(("hydra/launcher=", "resources.nodes=", "resources.tasks_per_node="))]
    reference = _launch(tmp_path, data_dir, f"{kept}local", "resources.tasks_per_node=2", base=local)  # while the SLURM gang is requeued
    wait_for(lambda: search.record("t0000").state.is_finished(), 300, f"the {kept} gang to finish")
    record = search.record("t0000")
    first, *_, last = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.PREEMPTED) and 10 <= first.step < 40
    assert last.resumed_from == first.step and last.how is AttemptEnd.COMPLETED
    steps = {line.split("|")[0]: line.split("|")[1:] for line in sh("sacct", "-n", "-P", "-j", first.job_id, "-o", "JobID,NNodes,NTasks").splitlines()}
    assert steps[f"{first.job_id}.0"][:2] == ["2", "2"], steps  # srun's step: one rank on each of 2 nodes
    assert same_weights(search, reference)
    assert record.metric == reference.record("t0000").metric
