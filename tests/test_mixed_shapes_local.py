"""A search whose trials differ in shape (issue 50), through the real launch: a bad mapping is one
line and writes nothing; a local search of 1-rank and 2-rank trials side by side (examples/parcel_loop's
data-parallel loop) runs, reserves and charges each trial as its own shape. The pure rules:
tests/test_shape.py."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from test_own_model import base_args, write_model

from parcel_hpc.budget import BudgetLedger
from parcel_hpc.ledger import SearchDir, TrialState
from parcel_hpc.propose.specs import history_free_specs, plan_for
from parcel_hpc.testing import launch, parcel_hpc, run_trial_directly
from parcel_hpc.worker import WorkerPlan

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

MIXED_LOOP = [
    "trainer.target=parcel_loop:train_ddp",
    "~space.params.hidden",
    "~space.params.l2",
    "batch_size=choice(32)",
    "lr=choice(0.03,0.1)",
    "width=choice(4,8)",
    "train.steps=20",
    "pruner=none",
    "resources.shape_by=width",
    "resources.shapes={8:{tasks_per_node:2}}",
]
ENV = {"PYTHONPATH": str(ROOT / "examples")}


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["resources.shape_by=depth"], "resources.shape_by='depth' is not a searched parameter"),
        (["resources.shapes={5:{tasks_per_node:2}}"], "resources.shapes.5={'tasks_per_node': 2} is keyed by a value width does not take"),
        (["resources.shapes={8:{tasks_per_node:0}}"], "resources.shapes.8.tasks_per_node=0 is not a positive whole number"),
        (["resources.shapes={8:{nodes:2}}"], "resources.nodes=2 asks for a trial of 2 ranks"),  # the local executor: one machine
        (["sampler=tpe"], "resources.shape_by='width' gives trials of 2 shapes in slots (hydra.launcher.dispatch=auto) with a sampler that learns"),
        (["hydra.launcher.pack_size=2"], "hydra.launcher.pack_size=2 packs trials of 2 ranks"),
    ],
)
def test_bad_shapes_through_the_launch_are_one_line_and_write_nothing(tmp_path, data_dir, overrides, needle):
    given = {o.split("=")[0] for o in overrides}  # given twice, Hydra would merge the second into the first
    args = [f"search.root={tmp_path / 'runs'}", *(o for o in MIXED_LOOP if o.split("=")[0] not in given), *overrides]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()


def test_keys_written_as_numbers_and_as_text_launch_as_the_contract_pins_them(tmp_path, data_dir):
    """``{relu: ..., 1: ...}`` for ``choice(relu,'1')``: Hydra keeps a str and an int key; the launch's
    record (sorted JSON) and the contract take both as text, and the search runs (a traceback after
    the freeze before)."""
    env = write_model(tmp_path / "lab", extra="{'act': Param(str, default='relu')}", build_check="params['act']")
    args = base_args(tmp_path, "k", "trainer.target=my_models:Model", "act=choice(relu,'1')", "search.n_trials=2", "resources.shape_by=act")
    res = launch([*args, "resources.shapes={relu:{nodes:1},1:{nodes:1}}"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    search = SearchDir(tmp_path / "runs" / "k")
    assert search.contract()["resources"]["shapes"] == {"1": {"nodes": 1, "tasks_per_node": 1}, "relu": {"nodes": 1, "tasks_per_node": 1}}
    assert all(r.state.is_finished() for r in search.records())


pytestmark = pytest.mark.xdist_group("mixed-shapes-local")  # one worker runs the module: the search of two shapes once, not once a worker


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, artifacts, nvml_dir):
    """Trials of width 4 (one rank) and width 8 (two ranks) of one search on the local executor, each
    rank granted one of four GPUs the fake driver library answers for (the loop trains on the CPU)."""
    root = tmp_path_factory.mktemp("mixed")
    shutil.copytree(artifacts["dir"], root / "data")
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LD_LIBRARY_PATH": str(nvml_dir), "FAKE_NVML_UTILIZATION": "40,70,40,70"}
    args = [f"search.root={root}", "search.revision=m", "search.n_trials=6", "resources.gpus=1", *MIXED_LOOP]
    res = launch(args, cwd=root, data_dir=root / "data", env={**ENV, **gpus})
    assert res.returncode == 0, res.stderr[-3000:]
    return SearchDir(root / "m"), res


def test_a_search_of_two_shapes_runs_each_trial_as_its_own_shape(mixed):
    search, res = mixed
    records = {r.trial_id: r for r in search.records()}
    widths = {tid: int(r.spec.params["width"]) for tid, r in records.items()}
    assert set(widths.values()) == {4, 8}, widths  # both shapes drawn
    assert all(r.state is TrialState.COMPLETED and len(r.attempts) == 1 for r in records.values())
    contract = search.contract()
    assert contract["resources"]["shapes"] == {"8": {"nodes": 1, "tasks_per_node": 2}} and "tasks_per_node" not in contract["resources"]
    for tid, r in records.items():
        ranks = 2 if widths[tid] == 8 else 1
        assert r.spec.shape.ranks == ranks and r.spec.shape.gpus == ranks  # its spec: its own shape
        assert WorkerPlan.load(search, tid).shape == r.spec.shape  # the job it ran in
        ckpt = search.path / "checkpoints" / tid
        if ranks == 2:  # one checkpoint across its two ranks, each a process of its job
            manifest = json.loads((ckpt / "ckpt-000020.manifest.json").read_text())
            assert manifest["world_size"] == 2
            assert "global_rank=1(2)" in (search.submitit_dir / "local" / f"{r.attempts[0].job_id}_1_log.out").read_text()
        else:
            assert (ckpt / "ckpt-000020.h5").is_file() and not list(ckpt.glob("*.manifest.json"))
    assert "up to 2 GPU + 2 CPU per attempt" in res.stdout  # the worst case: each trial at its own shape


def test_each_trial_of_a_search_of_two_shapes_is_reserved_and_charged_its_own_shape(mixed):
    search, _ = mixed
    contract = search.contract()
    holds = BudgetLedger.read(search.path).holds
    limit_h = float(contract["resources"]["time_limit_min"]) / 60.0
    for r in search.records():
        (attempt,) = r.attempts
        hold = holds[next(k for k in holds if k.trial_id == r.trial_id)]
        shape = r.spec.shape
        assert (hold.reserved_gpu_hours, hold.reserved_cpu_hours) == pytest.approx(
            (shape.gpus * limit_h, shape.cpus * limit_h), abs=1e-6
        )  # the journal's unit: 1e-6 h
        # Charged ranks x GPUs per rank x hours: a gang's rank 0 sees its own GPU only, so its allocation is its request.
        assert attempt.gpus in (None, shape.gpus)
        hours = (attempt.ended - attempt.started) / 3600.0
        assert (hold.used_gpu_hours, hold.used_cpu_hours) == pytest.approx((shape.gpus * hours, shape.cpus * hours), abs=2e-6)


def test_reconcile_splits_only_the_gang_s_runs_per_rank_and_charges_each_trial_its_own_gpus(mixed):
    search, _ = mixed
    report = json.loads(parcel_hpc(["reconcile", str(search.path), "--json"], cwd=search.path.parent).stdout)["campaigns"][0]
    shapes = {r.trial_id: r.spec.shape for r in search.records()}
    gangs = sorted(tid for tid, shape in shapes.items() if shape.is_gang)
    assert sorted({r["trial_id"] for r in report["ranks"]}) == gangs  # a trial of one rank has no per-rank lines
    assert all(len([r for r in report["ranks"] if r["trial_id"] == tid]) == 2 for tid in gangs)
    for line in report["attempts"]:
        assert line["gpus"] == shapes[line["trial_id"]].gpus  # each run charged its own trial's GPUs


def test_a_spec_forged_to_another_shape_or_a_job_of_another_world_size_is_rejected_before_anything_is_held(tmp_path, data_dir):
    """A frozen search of two shapes, two of its width=8 (2-rank) trials proposed but not dispatched:
    one spec forged to one rank (run, it would be charged one rank), the other honest but run as one
    process. Each attempt is rejected (reject:resources) before it reserves, claims or trains."""
    res = launch([f"search.root={tmp_path}", "search.revision=f", "search.n_trials=0", *MIXED_LOOP], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    search = SearchDir(tmp_path / "f")
    forged, honest = [s for s in history_free_specs(search.contract(), 0, 8) if s.params["width"] == 8][:2]
    assert forged.shape.ranks == 2 and honest.shape.ranks == 2
    search.write_spec(replace(forged, resources={k: v for k, v in forged.resources.items() if k not in ("nodes", "tasks_per_node")}))
    search.write_spec(honest)
    cfg = {
        "snapshot": {"path": str(data_dir / "parcels.h5")},
        "split": {"path": str(data_dir / "split-group_r8.json")},
        "image": {"kind": "computed"},
        "checkpoint": {"dir": str(search.path / "checkpoints"), "every_steps": 10, "keep_last": 2},
    }
    for spec in (forged, honest):
        ran = run_trial_directly(plan_for(search.spec(spec.trial_id), cfg, search.contract(), search.path), env=ENV)
        assert ran.returncode == 0, ran.stderr[-3000:]
        record = search.record(spec.trial_id)
        assert record.state is TrialState.REJECTED and str(record.attempts[-1].outcome) == "reject:resources", record
        assert not (search.path / "checkpoints" / spec.trial_id).exists()
    view = BudgetLedger.read(search.path)
    assert view is None or not view.holds  # nothing was reserved


def test_slots_of_each_shape_take_only_the_trials_of_their_shape(tmp_path, data_dir):
    """hydra.launcher.dispatch=slots with a fixed list: the launch keeps slots of each shape alive
    while trials of that shape are queued; each slot's job is of its shape (a 2-rank slot: two
    processes) and takes only trials of its shape."""
    args = [f"search.root={tmp_path}", "search.revision=s", "search.n_trials=8", "resources.gpus=0", "hydra.launcher.dispatch=slots", *MIXED_LOOP]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    search = SearchDir(tmp_path / "s")
    slot_jobs = {str(s["job_id"]) for s in search.slot_records()}
    records = list(search.records())
    assert {int(r.spec.params["width"]) for r in records} == {4, 8} and all(r.state is TrialState.COMPLETED for r in records)
    ranks_of_job: dict[str, set[int]] = {}
    for r in records:
        (attempt,) = r.attempts
        assert attempt.job_id in slot_jobs  # taken by a slot
        ranks_of_job.setdefault(attempt.job_id, set()).add(r.spec.shape.ranks)
        two_processes = (search.submitit_dir / "local" / f"{attempt.job_id}_1_log.out").exists()
        assert two_processes == (r.spec.shape.ranks == 2)  # the slot's job is of its trial's shape
    assert all(len(shapes) == 1 for shapes in ranks_of_job.values())  # no slot ran trials of two shapes
