"""The governed search end to end on the embedded local executor: real Hydra, real submitit
processes, real h5py files. Every case runs the entry point a user runs."""

import json
import os
from pathlib import Path

import pytest
from test_splits import _old_group_split

from parcel_hpc.data import make_snapshot
from parcel_hpc.governance.contract import load_contract
from parcel_hpc.launch.display import DRY_RUN_ROWS
from parcel_hpc.ledger.store import SearchDir
from parcel_hpc.propose.specs import history_free_specs, plan_for
from parcel_hpc.testing import faults, launch, parcel_hpc, run_trial_directly
from parcel_hpc.worker import WorkerPlan

REV = "search.revision=test-r1"


def run(tmp_path, data_dir, *overrides, **kw):
    return launch([f"search.root={tmp_path / 'runs'}", REV, *overrides], cwd=tmp_path, data_dir=data_dir, **kw)


def search_dir(tmp_path, rev="test-r1") -> Path:
    return tmp_path / "runs" / rev


def status(path) -> dict:
    res = parcel_hpc(["status", str(path), "--json"])
    assert res.returncode == 0, res.stderr
    return res.json()


def test_search_runs_records_and_continues_without_redispatch(tmp_path, data_dir):
    first = run(tmp_path, data_dir, "search.n_trials=5")
    assert first.returncode == 0, first.stderr
    assert "summary" in first.stdout and "best validation" in first.stdout
    st = status(search_dir(tmp_path))
    assert st["contract_digest"] == load_contract(search_dir(tmp_path)).digest
    assert sum(st["counts"].values()) == 5 and len(st["trials"]) == 5
    assert all(t["state"] in ("completed", "pruned") for t in st["trials"])
    completed = [t for t in st["trials"] if t["state"] == "completed"]
    assert completed and all(t["metric"] is not None and t["step"] == 82 for t in completed)
    assert set(st["trials"][0]) >= {"trial_id", "state", "metric", "step", "attempts", "reason"}
    # what ran, on what, how it ended: the record keeps params, seed, config hash and jobs
    spec = json.loads((search_dir(tmp_path) / "trials" / "t0000" / "spec.json").read_text())
    assert spec["image_digest"].startswith("sha256:") and spec["resources"]["gpus"] == 1

    again = run(tmp_path, data_dir, "search.n_trials=7")
    assert again.returncode == 0, again.stderr
    launches = sorted((search_dir(tmp_path) / "launches").glob("*.json"))
    second = json.loads(launches[-1].read_text())
    assert sorted(second["finished_before"]) == [f"t000{i}" for i in range(5)]
    assert sorted(second["dispatched"]) == ["t0005", "t0006"]
    st = status(search_dir(tmp_path))
    assert all(t["attempts"] == 1 for t in st["trials"])  # no finished trial ran twice


@pytest.mark.parametrize(
    "override,outcome",
    [
        ("split=random_r7", "reject:split_digest"),
        ("metric.miss_cost=7.0", "reject:metric"),
        ("space.params.lr.high=0.5", "reject:space"),
        ("resources.gpus=2", "reject:resources"),
    ],
)
def test_changed_contract_is_refused_before_dispatch(tmp_path, data_dir, override, outcome):
    assert run(tmp_path, data_dir, "search.n_trials=0").returncode == 0
    contract_before = (search_dir(tmp_path) / "contract.json").read_bytes()
    res = run(tmp_path, data_dir, "search.n_trials=2", override)
    assert res.returncode == 3, res.stderr
    assert res.stdout.splitlines()[0] == outcome
    assert "new search.revision" in res.stderr
    assert (search_dir(tmp_path) / "contract.json").read_bytes() == contract_before
    assert not (search_dir(tmp_path) / "trials").exists()


def test_changed_snapshot_file_is_refused(tmp_path, data_dir):
    assert run(tmp_path, data_dir, "search.n_trials=0").returncode == 0
    os.remove(data_dir / "parcels.h5")
    make_snapshot(data_dir, seed=0, label_noise=0.03)  # same schema, other content
    res = run(tmp_path, data_dir, "search.n_trials=1")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "reject:snapshot_digest"


def test_random_split_cannot_start_a_search(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "split=random_r7", "search.n_trials=1")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "reject:split_method"
    assert not search_dir(tmp_path).exists()


def test_a_split_that_leaks_a_reshipped_parcel_cannot_start_a_search(tmp_path):
    """A group split made by shipment alone, before splits were checked, on a snapshot whose parcel
    travelled in two shipments: a new search refuses it in one line before anything is written."""
    data = tmp_path / "leaky"
    snap = make_snapshot(data, seed=0, reshipped=4)
    _old_group_split(snap.path, data, "group_r8")
    res = run(tmp_path, data, "search.n_trials=1")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "leaks: parcel_id 'SHP-" in lines[0] and " lies in " in lines[0] and "make a new split revision" in lines[0]
    assert not search_dir(tmp_path).exists()


@pytest.mark.parametrize("split,method", [("time_r1", "time"), ("time_kfold_r1", "time_kfold"), ("group_kfold_r1", "group_kfold")])
def test_a_search_pins_the_boundary_it_validates_across(tmp_path, data_dir, split, method):
    res = run(tmp_path, data_dir, f"split={split}", "search.n_trials=0")
    assert res.returncode == 0, res.stderr
    contract = load_contract(search_dir(tmp_path))
    assert contract["split_method"] == method and contract["split_revision"] == split


def test_a_one_rank_search_pins_no_shape_and_keeps_its_digest(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "search.n_trials=0", "resources.nodes=1", "resources.tasks_per_node=1")
    assert res.returncode == 0, res.stderr
    assert set(load_contract(search_dir(tmp_path))["resources"]) == {"gpus", "cpus", "mem_gb", "time_limit_min"}


def test_pinned_snapshot_digest_must_match(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "snapshot.digest=sha256:" + "0" * 64, "search.n_trials=1")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "reject:snapshot_digest"


@pytest.mark.parametrize(
    "override,needle",
    [
        ("split=nope", "split"),
        ("foo=1", "foo"),
        ("search.n_trials=abc", "n_trials"),
        ("search.n_trials=[1,", "search.n_trials"),
        ("snapshot.path=/nonexistent/parcels.h5", "make-snapshot"),
        ("search.root=/proc/forbidden", "not writable"),
        ("search.n_trials=1,2", "sweep override"),
        ("hydra/launcher=basic", "submitit_local or submitit_slurm"),
        ("hydra.launcher.submitit_folder=/x", "submitit_folder"),
        # Hydra's append form adds a key the schema lacks: refused however it is spelled, with the key meant.
        ("+search.n_trial=8", "search.n_trial is not a configuration key, so nothing would read it; did you mean search.n_trials?"),
        ("hydra.sweeper._target_=os.getcwd", "hydra.sweeper._target_='os.getcwd': a parcel_hpc search runs the parcel sweeper only"),
        ("resources.nodes=2", "asks for a trial of 2 ranks (2 nodes x 1 rank x 1 GPU); the local executor runs a trial on this one machine"),
        ("resources.tasks_per_node=2 hydra.launcher.pack_size=2", "hydra.launcher.pack_size=2 packs trials of 2 ranks; a gang is its own job"),
        ("resources.tasks_per_node=2 split=group_kfold_r1", "with a split of 5 folds; a gang's K fold runs are not built"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, data_dir, override, needle):
    res = run(tmp_path, data_dir, *override.split(" "))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("contract.json"))


def test_hydra_callbacks_are_refused_before_hydra_runs_them(tmp_path, data_dir):
    """A callback is any callable Hydra instantiates in the launch's own process: this one would copy
    the final list out before the sweeper saw the config."""
    stolen = tmp_path / "stolen.json"
    callback = "+hydra.callbacks.copy"
    res = run(tmp_path, data_dir, f"{callback}._target_=shutil.copyfile", f"{callback}.src={data_dir / 'final-group_r8.json'}", f"{callback}.dst={stolen}")
    assert res.returncode == 2 and res.stderr.startswith("error: hydra.callbacks names copy:") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not stolen.exists() and not search_dir(tmp_path).exists()


def test_budget_hold_before_anything_is_dispatched(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "search.n_trials=83")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "hold:budget"
    res = run(tmp_path, data_dir, "search.n_trials=40", "budget.gpu_hours_cap=5")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "hold:budget"
    assert "lower search.n_trials" in res.stderr
    assert not (search_dir(tmp_path) / "trials").exists() or not list((search_dir(tmp_path) / "trials").rglob("journal-*"))


def test_a_dry_run_shows_its_first_trials_and_counts_the_rest(tmp_path, data_dir):
    """A row per trial took 1.6 GB at a million trials (docs/performance.md, "A dry run")."""
    n = DRY_RUN_ROWS + 70
    res = run(tmp_path, data_dir, f"search.n_trials={n}", f"budget.max_trials={n}", "budget.gpu_hours_cap=1000", "budget.cost_cap=10000", "search.dry_run=true")
    assert res.returncode == 0, res.stderr
    assert f"dry run: {n} trials would be dispatched" in res.stdout and "... 70 more" in res.stdout, res.stdout[-3000:]
    assert f"t{DRY_RUN_ROWS - 1:04d}" in res.stdout and f"t{DRY_RUN_ROWS:04d}" not in res.stdout
    assert not search_dir(tmp_path).exists()  # a dry run writes nothing


def _plan(tmp_path, data_dir, *overrides):
    """Freeze a search (a launch of zero trials), propose its first trial without dispatching it."""
    dry = run(tmp_path, data_dir, "search.n_trials=1", "search.dry_run=true", *overrides)
    assert dry.returncode == 0 and "dry run" in dry.stdout and not search_dir(tmp_path).exists()  # a dry run writes nothing
    res = run(tmp_path, data_dir, "search.n_trials=0", *overrides)
    assert res.returncode == 0, res.stderr
    sd = SearchDir(search_dir(tmp_path))
    sd.write_spec(history_free_specs(sd.contract(), 0, 1)[0])
    cfg = {
        "snapshot": {"path": str(data_dir / "parcels.h5")},
        "split": {"path": str(data_dir / "split-group_r8.json")},
        "image": {"kind": "computed"},
        "checkpoint": {"dir": str(sd.path / "checkpoints"), "every_steps": 10, "keep_last": 2},
    }
    return sd, cfg


def test_worker_refuses_a_random_split_it_was_pointed_at(tmp_path, data_dir):
    sd, cfg = _plan(tmp_path, data_dir)
    cfg["split"]["path"] = str(data_dir / "split-random_r7.json")
    plan = plan_for(sd.spec("t0000"), cfg, sd.contract(), sd.path)
    res = run_trial_directly(plan)
    assert res.returncode == 0, res.stderr
    rec = sd.record("t0000")
    # nothing ran against anything: the attempt is rejected, the trial waits for the right split
    assert rec.state.value == "queued" and rec.awaiting_environment() and rec.reason.startswith("reject:split_digest: this worker sees split_digest")
    assert rec.attempts[-1].how.value == "rejected" and str(rec.attempts[-1].outcome) == "reject:split_digest"
    assert not (sd.path / "checkpoints" / "t0000").exists()  # refused before claiming or training


def test_worker_refuses_a_newer_image_archive(tmp_path, data_dir):
    archive = tmp_path / "worker.sif"
    archive.write_bytes(b"image v1")
    sd, cfg = _plan(tmp_path, data_dir, "image=archive", f"image.path={archive}")
    archive.write_bytes(b"image v2: rebuilt with a newer numpy")
    cfg["image"] = {"kind": "archive", "path": str(archive)}
    res = run_trial_directly(plan_for(sd.spec("t0000"), cfg, sd.contract(), sd.path))
    assert res.returncode == 0, res.stderr
    rec = sd.record("t0000")
    assert rec.state.value == "queued" and rec.awaiting_environment() and rec.reason.startswith("reject:image_digest: this worker sees image_digest")


def test_same_seed_and_params_give_the_same_metric(tmp_path, data_dir):
    metrics = []
    for rev in ("same-a", "same-b"):
        res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", "search.n_trials=1", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
        assert res.returncode == 0, res.stderr
        metrics.append(status(search_dir(tmp_path, rev))["trials"][0]["metric"])
    assert metrics[0] is not None and metrics[0] == metrics[1]


def test_without_multirun_flag_the_launch_explains(tmp_path, data_dir):
    res = launch([f"search.root={tmp_path / 'runs'}"], cwd=tmp_path, data_dir=data_dir, multirun=False)
    assert res.returncode == 2 and "-m" in res.stderr


def test_with_the_multirun_flag_a_config_s_own_run_mode_still_launches_the_search(tmp_path, data_dir):
    """The launch skips Hydra's second composition (``get_mode``): with -m the search runs whatever
    ``hydra.mode`` says, as Hydra decides it."""
    res = run(tmp_path, data_dir, "search.n_trials=1", "hydra.mode=RUN", "search.dry_run=true")
    assert res.returncode == 0 and "dry run: 1 trials would be dispatched" in res.stdout, res.stderr


def test_a_non_finite_number_in_the_config_is_bad_input(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "search.n_trials=1", "+space.params.fault={type:choice,values:[nan]}", faults.TRAINER)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "nan" in res.stderr and res.stderr.count("\n") == 1


def test_an_attempt_that_died_after_its_final_checkpoint_resumes_and_scores(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "search.n_trials=1", "pruner=none")
    assert res.returncode == 0, res.stderr
    sd = SearchDir(search_dir(tmp_path))
    metric = sd.record("t0000").metric
    # The attempt dies between its step-82 checkpoint and recording how it ended.
    for journal in (sd.trial_dir("t0000")).glob("journal-a1-*.jsonl"):
        journal.write_text("".join(l + "\n" for l in journal.read_text().splitlines() if '"kind":"ended"' not in l))
    assert sd.record("t0000").state.value == "running"
    again = run_trial_directly(WorkerPlan.load(sd, "t0000"))
    assert again.returncode == 0, again.stderr
    rec = sd.record("t0000")
    assert rec.state.value == "completed" and rec.metric == metric
    assert rec.attempts[-1].resumed_from == 82 and rec.attempts[0].how.value == "lost"
    # and a finished trial that is dispatched once more does not train again
    assert run_trial_directly(WorkerPlan.load(sd, "t0000")).returncode == 0
    assert len(sd.record("t0000").attempts) == 2


def test_a_full_budget_ends_trials_budget_exhausted_not_as_an_error(tmp_path, data_dir):
    from parcel_hpc.budget import BudgetLedger, search_caps

    sd, cfg = _plan(tmp_path, data_dir, "budget.gpu_hours_cap=3", "resources.time_limit_min=60")
    plan = plan_for(sd.spec("t0000"), cfg, sd.contract(), sd.path)
    # Another process (a concurrent launch, say) already holds most of the cap.
    held = BudgetLedger(sd.path, search_caps(sd.contract())).reserve("t0099", 1, 2.5)
    assert held.ok
    res = run_trial_directly(plan)
    assert res.returncode == 0, res.stderr
    rec = sd.record("t0000")
    assert rec.state.value == "budget_exhausted" and rec.reason.startswith("hold:budget")
    assert not (sd.path / "checkpoints" / "t0000").exists()  # refused before it used anything
    totals = BudgetLedger(sd.path).totals()
    assert totals.reserved_gpu_hours == 2.5  # the refusal reserved nothing
