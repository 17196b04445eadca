"""The registry gate and the serving-parity check, on values and on a real trainer."""

import numpy as np
import pytest

from parcel_hpc.data import read_split
from parcel_hpc.release import outcome_of
from parcel_hpc.selection.jobs import _parity
from parcel_hpc.testing.trainers import ServesTheDataItWasBuiltWith, SkewedServing
from parcel_hpc.trainer import load_training_data
from parcel_hpc.trainer.numpy_mlp import NumpyMLP

CHECKS = ("data", "reproducible", "parity", "performance", "slices", "final", "final-performance")


@pytest.mark.parametrize(
    "failing, outcome",
    [
        ("data", "hold:invalid-winner"),
        ("reproducible", "hold:invalid-winner"),
        ("slices", "hold:slice-quality"),
        ("performance", "hold:performance"),
        ("parity", "hold:serving-parity"),
        ("final", "hold:final-not-evaluated"),
        ("final-performance", "hold:final-performance"),
    ],
)
def test_any_check_that_did_not_pass_keeps_the_artifact_out(failing, outcome):
    checks = dict.fromkeys(CHECKS, "passed")
    checks[failing] = "failed" if failing != "final" else "missing"
    assert str(outcome_of({"checks": checks})) == outcome


@pytest.mark.parametrize("decided", ["slices", "performance", "final-performance"])
def test_a_decided_gate_is_registrable(decided):
    checks = dict.fromkeys(CHECKS, "passed") | {decided: "decided"}
    assert str(outcome_of({"checks": checks})) == "release:registered"


@pytest.fixture(scope="module")
def data(artifacts):
    return load_training_data(artifacts["snapshot_path"], read_split(artifacts["split_path"]), {"revision": "stats-r1", "pool": 4})


@pytest.mark.parametrize("cls, passes", [(NumpyMLP, True), (SkewedServing, False)])
def test_serving_parity_catches_a_serving_path_that_skews(data, cls, passes):
    params = {"lr": 0.01, "hidden": 16, "l2": 1e-4, "batch_size": 64}
    trainer = cls()
    trainer.build(params, 1234, data)
    for _ in range(5):
        trainer.step()
    scores = trainer.predict("validation")
    parity = _parity(cls, params, 1234, trainer.state().checked(), data, scores, 1e-6)
    assert parity["passed"] is passes and parity["problem"] == ""
    assert parity["examples"] == len(scores)
    if not passes:
        assert parity["max_abs_difference"] > 1e-6 and np.isfinite(parity["max_abs_difference"])


def test_serving_parity_holds_a_trainer_that_cannot_serve_from_its_state_alone(data):
    params = {"lr": 0.01, "hidden": 0, "l2": 1e-4, "batch_size": 64}
    trainer = ServesTheDataItWasBuiltWith()
    trainer.build(params, 1234, data)
    trainer.step()
    trained = trainer.serve(data.validation.images)
    assert np.array_equal(trained, trainer.predict("validation"))  # the old check, serving the trained trainer, passed it
    parity = _parity(ServesTheDataItWasBuiltWith, params, 1234, trainer.state().checked(), data, trained, 1e-6)
    assert parity["passed"] is False and parity["max_abs_difference"] is None
    assert parity["problem"].startswith("built without examples and given its artifact's state, Diverged: predict('serving') returned non-finite scores"), (
        parity
    )
    served = _parity(NumpyMLP, params, 1234, trainer.state().checked(), data, trained, 1e-6)  # the same state, a trainer that keeps it
    assert served["passed"] is True
