"""The trainer interface: the built-in trainer reproduces the pre-interface model, every shipped
trainer passes the conformance check, bad targets are refused at the door, and a trainer's faults
end its trial with their class (never the launcher)."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from parcel_hpc.config import CONF_DIR
from parcel_hpc.data import read_split
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.metric import MissCost
from parcel_hpc.ledger import SearchDir
from parcel_hpc.propose.space import normalize, sample
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.trainers import FAULT_STEP, PROTECTED_PATH_ENV
from parcel_hpc.trainer import BUILTIN, FinalPartitionRefused, TrainerState, UnsavableState, build_params, load_training_data, trainer_class, trainer_identity
from parcel_hpc.trainer.conformance import check_trainer
from parcel_hpc.trainer.numpy_mlp import NumpyMLP

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "numpy_mlp_metrics.json").read_text())
SGD = "parcel_sgd:SGDTrainer"
EXAMPLES_ENV = {"PYTHONPATH": str(ROOT / "examples")}


@pytest.fixture
def sgd_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))


def test_builtin_trainer_reproduces_the_models_metrics_before_the_interface(training_data):
    """tests/golden/numpy_mlp_metrics.json was captured from the worker's own model code before it
    moved onto the trainer interface: all 82 trials of the demo's seeds, at every milestone."""
    params_space = yaml.safe_load((CONF_DIR / "space" / "space_r4.yaml").read_text())["params"]
    metric = MissCost("miss-cost-r3", 5.0, 1.0)
    for trial_id, golden in GOLDEN["trials"].items():
        params = sample(normalize(params_space), GOLDEN["search_seed"], int(trial_id[1:]))
        assert params == golden["params"]
        trainer = NumpyMLP()
        trainer.build(build_params(trainer, params), GOLDEN["train_seed"], training_data)
        values = {}
        for step in range(1, 83):
            trainer.step()
            if str(step) in golden["milestones"]:
                values[str(step)] = metric(trainer.predict("validation"), training_data.validation.labels)
        assert values == golden["milestones"], trial_id  # exactly: same floats, bit for bit


def test_a_search_on_the_builtin_trainer_records_the_golden_metrics(tmp_path, data_dir):
    res = launch([f"search.root={tmp_path}", "search.revision=golden", "search.n_trials=3", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    search = SearchDir(tmp_path / "golden")
    for record in search.records():
        seen = {str(e.data.step): e.data.value for e in search.events(record.trial_id) if e.kind.value == "milestone"}
        assert seen == GOLDEN["trials"][record.trial_id]["milestones"]
        assert record.metric == GOLDEN["trials"][record.trial_id]["milestones"]["82"]
    assert search.contract()["trainer"] == trainer_identity(BUILTIN)


@pytest.mark.parametrize("target", [BUILTIN, SGD])
def test_shipped_trainers_pass_the_conformance_check(target, training_data, sgd_on_path):
    for hidden in (0, 16):
        findings = check_trainer(trainer_class(target), training_data, {"lr": 0.02, "hidden": hidden, "l2": 1e-4, "batch_size": 32}, seed=7, steps=9)
        assert [f.check for f in findings] == ["step", "predict", "state", "resume", "determinism", "serving parity", "serving from state", "final partition"]
        assert all(f.ok for f in findings), findings


def test_conformance_check_names_what_breaks(training_data):
    from parcel_hpc.testing import trainers

    class ForgetsItsGenerator(NumpyMLP):
        def load_state(self, state):
            rng_state = self.rng.bit_generator.state  # keeps a fresh generator: batches repeat
            super().load_state(state)
            self.rng.bit_generator.state = rng_state

    params = {"lr": 0.02, "hidden": 0, "batch_size": 32}
    resume = {f.check: f for f in check_trainer(ForgetsItsGenerator, training_data, params, steps=5)}["resume"]
    assert not resume.ok and "RNG state" in resume.detail
    last = check_trainer(trainers.AsksForFinal, training_data, params, steps=3)[-1]
    assert (last.check, last.ok) == ("final partition", False)
    served = check_trainer(trainers.ServesTheDataItWasBuiltWith, training_data, params, steps=3)[-1]
    assert (served.check, served.ok) == ("serving from state", False) and "built without data and given its state, it does not serve" in served.detail
    error = check_trainer(trainers.UnsavableStateTrainer, training_data, params, steps=6)[-1]
    assert error.check == "error" and "dtype object" in error.detail


def test_training_data_refuses_the_final_partition_and_remembers(artifacts):
    data = load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "stats-r1", "pool": 4})
    assert data.partition("train") is data.train and data.partition("validation") is data.validation
    with pytest.raises(FinalPartitionRefused) as exc:
        data.partition("final")
    assert str(exc.value.outcome) == "reject:final_partition"
    assert data.asked_for_final == ("final",)
    with pytest.raises(KeyError):
        data.partition("everything")
    assert not data.train.images.flags.writeable and not data.validation.features.flags.writeable
    assert len(set(data.train.shipment_id) & set(data.validation.shipment_id)) == 0  # the group split holds


def test_trainer_state_is_checked_before_a_checkpoint_sees_it():
    assert TrainerState({"w": [1.0, 2.0]}, {"rng": {"state": 2**100}}).checked().arrays["w"].dtype == np.float64
    with pytest.raises(UnsavableState, match="dtype object"):
        TrainerState({"vocab": np.array(["a"], dtype=object)}).checked()
    with pytest.raises(UnsavableState, match="not JSON"):
        TrainerState({}, {"loss": float("nan")}).checked()


@pytest.mark.parametrize(
    "target, message",
    [
        ("numpy_mlp", "is not PACKAGE.MODULE:NAME"),
        ("no_such_package.trainers:Model", "module no_such_package.trainers does not import (ModuleNotFoundError"),
        ("parcel_hpc.testing.trainers:Missing", "module parcel_hpc.testing.trainers has no Missing"),
        ("parcel_hpc.testing.trainers:not_a_trainer", "is a function, not a trainer; decorate your train"),
        ("parcel_hpc.testing.trainers:Incomplete", "Incomplete lacks serve"),
    ],
)
def test_a_bad_target_is_one_line_before_anything_is_written(target, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        trainer_class(target)


def test_a_bad_target_exits_2_at_launch_and_freezes_nothing(tmp_path, data_dir):
    res = launch([f"search.root={tmp_path}", "search.revision=bad", "trainer.target=parcel_hpc.testing.trainers:Incomplete"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and res.stderr.startswith("error: trainer.target=parcel_hpc.testing.trainers:Incomplete: Incomplete lacks serve")
    assert not (tmp_path / "bad").exists()


def test_changing_the_trainer_code_mid_search_is_refused(tmp_path, data_dir):
    package = tmp_path / "lab" / "my_models"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from parcel_hpc.trainer.numpy_mlp import NumpyMLP\n\n\nclass Model(NumpyMLP):\n    pass\n")
    env = {"PYTHONPATH": str(tmp_path / "lab")}
    args = [f"search.root={tmp_path}", "search.revision=mine", "search.n_trials=1", "pruner=none", "trainer.target=my_models:Model"]
    first = launch(args, cwd=tmp_path, data_dir=data_dir, env=env)
    assert first.returncode == 0, first.stderr
    assert SearchDir(tmp_path / "mine").record("t0000").state.value == "completed"
    (package / "helpers.py").write_text("SCALE = 2.0\n")  # any source of the package counts, not only the class's module
    again = launch(args[:-3] + ["search.n_trials=2", "pruner=none", "trainer.target=my_models:Model"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert again.returncode == 3
    assert again.stdout.splitlines()[0] == "reject:trainer"
    assert SearchDir(tmp_path / "mine").trial_ids() == ["t0000"]


def _fault_search(tmp_path, data_dir, name, target, *overrides, env=None):
    res = launch(
        [
            f"search.root={tmp_path}",
            f"search.revision={name}",
            "search.n_trials=1",
            "pruner=none",
            f"trainer.target=parcel_hpc.testing.trainers:{target}",
            *overrides,
        ],
        cwd=tmp_path,
        data_dir=data_dir,
        env=env,
    )
    # The launcher itself never crashes on a trainer's fault; with nothing completed it says so (exit 3).
    assert res.returncode == 3 and "hold:no-result" in res.stdout, res.stdout + res.stderr
    return SearchDir(tmp_path / name).record("t0000")


@pytest.mark.parametrize(
    "target, cause, step",
    [
        ("Raises", "exception", FAULT_STEP - 1),  # the step reached: FAULT_STEP never completed
        ("NanLoss", "diverged", FAULT_STEP - 1),
        ("UnsavableStateTrainer", "unsavable_state", 10),
        ("WrongShapePredictions", "invalid_predictions", 10),
    ],
)
def test_a_trainers_fault_fails_its_trial_with_its_class(tmp_path, data_dir, target, cause, step):
    rec = _fault_search(tmp_path, data_dir, target.lower(), target)
    assert rec.state.value == "failed"
    # Retried once as the lifecycle says (from its last checkpoint); the same class twice is the result.
    assert [(a.how.value, a.cause.value) for a in rec.attempts] == [("failed", cause)] * 2
    assert rec.attempts[0].step == step
    assert rec.cause.value == cause


def test_a_trainer_asking_for_the_final_partition_is_rejected(tmp_path, data_dir):
    rec = _fault_search(tmp_path, data_dir, "asks", "AsksForFinal")
    assert rec.state.value == "rejected" and rec.detail.startswith("reject:final_partition: the trainer asked for final")
    assert len(rec.attempts) == 1  # a rejection is final: never retried


def test_a_trainer_opening_the_final_record_is_rejected(tmp_path, data_dir):
    final = data_dir / "final-group_r8.json"
    rec = _fault_search(tmp_path, data_dir, "opens", "OpensProtectedFile", env={PROTECTED_PATH_ENV: str(final)})
    assert rec.state.value == "rejected" and rec.detail.startswith("reject:final_partition")
    assert str(final.resolve()) in rec.detail and rec.attempts[-1].step == FAULT_STEP


def test_a_trainer_reading_the_final_record_through_a_program_is_rejected(tmp_path, data_dir):
    """`cat` opens the file where Python's audit hook cannot see: starting any program from trainer
    code is refused and rejects the trial, so the read never happens unrecorded."""
    final = data_dir / "final-group_r8.json"
    rec = _fault_search(tmp_path, data_dir, "cat", "ReadsProtectedFileThroughAProgram", env={PROTECTED_PATH_ENV: str(final)})
    assert rec.state.value == "rejected" and rec.detail.startswith("reject:final_partition"), rec.detail
    assert "started the program cat" in rec.detail and rec.attempts[-1].step == FAULT_STEP
    assert len(rec.attempts) == 1  # a rejection is final: never retried


def test_check_trainer_command(tmp_path, artifacts):
    ok = parcel_hpc(["check-trainer", SGD, "--data", artifacts["dir"], "--param", "lr=0.02", "--param", "hidden=8", "--steps", "4"], env=EXAMPLES_ENV)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "serving parity" in ok.stdout
    bad = parcel_hpc(["check-trainer", "parcel_hpc.testing.trainers:AsksForFinal", "--data", artifacts["dir"], "--param", "lr=0.02"])
    assert bad.returncode == 1 and "FAILED" in bad.stdout
    missing = parcel_hpc(["check-trainer", SGD, "--data", str(tmp_path / "nowhere")], env=EXAMPLES_ENV)
    assert missing.returncode == 2 and "make-snapshot" in missing.stderr
