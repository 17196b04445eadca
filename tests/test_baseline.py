"""The baseline record: parsed from the config group once, pinned in the contract, read back (pure
values; the registry entry is a few files in a temporary directory)."""

import json

import pytest

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import GovernanceRefusal
from parcel_hpc.selection.baseline import Baseline, BaselineKind, ReleasedArtifact, baseline_trainer, resolve
from parcel_hpc.trainer import BUILTIN, trainer_identity
from parcel_hpc.trainer.numpy_mlp import NumpyMLP

SEARCH = "parcel_hpc.testing.trainers:SkewedServing"  # another class than the baseline's below
LOGREG = {"name": "logreg", "trainer": BUILTIN, "params": {"lr": 0.01, "hidden": 0, "l2": 0.001, "batch_size": 64}, "artifact": None}


def test_a_trained_baseline_names_its_own_trainer_and_pins_its_identity():
    b = resolve(LOGREG, SEARCH)
    assert b.kind is BaselineKind.TRAINED and b.target == BUILTIN and b.trainer == trainer_identity(BUILTIN)
    pinned = b.to_json(trainer_identity(SEARCH))
    assert pinned == {"name": "logreg", "params": LOGREG["params"], "trainer": trainer_identity(BUILTIN)}
    assert Baseline.pinned(pinned, trainer_identity(SEARCH)) == b


def test_a_baseline_of_the_search_trainer_pins_what_searches_pinned_before():
    """Name and params only, so a search frozen before baselines had trainers continues."""
    b = resolve({**LOGREG, "trainer": None}, BUILTIN)
    assert b.target == BUILTIN
    assert b.to_json(trainer_identity(BUILTIN)) == {"name": "logreg", "params": LOGREG["params"]}
    older = {"name": "logreg", "params": {"lr": 0.01}}
    assert Baseline.pinned(older, trainer_identity(BUILTIN)) == Baseline("logreg", BaselineKind.TRAINED, trainer_identity(BUILTIN), {"lr": 0.01})


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"name": " "}, "selection.baseline.name is empty"),
        ({"params": {"lr": 0.01, "width": 3}}, "names width, which parcel_hpc.trainer.numpy_mlp:NumpyMLP does not take"),
        ({"params": {"hidden": 3}}, "leaves out lr"),
        ({"params": {"lr": "fast"}}, "selection.baseline.params.lr='fast'"),
        ({"params": {"lr": float("nan")}}, "is not a value a trial could take"),
        ({"trainer": "parcel_hpc.testing.trainers:not_a_trainer"}, "selection.baseline.trainer=parcel_hpc.testing.trainers:not_a_trainer is a function"),
        ({"trainer": "nope"}, "selection.baseline.trainer='nope' is not PACKAGE.MODULE:NAME"),
        ({"artifact": "/x"}, "a released baseline is scored as it was released"),
    ],
)
def test_a_baseline_that_cannot_be_used_is_one_line(change, needle):
    with pytest.raises(UsageError) as refused:
        resolve({**LOGREG, **change}, SEARCH)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_a_stray_param_says_how_to_give_exactly_yours():
    with pytest.raises(UsageError, match=r"selection/baseline=given .*'\+selection.baseline.params=\{\.\.\.\}'"):
        resolve({**LOGREG, "params": {**LOGREG["params"], "width": 3}}, SEARCH)


def _entry(tmp_path, packet=None):
    """A registry entry as release.folder.write_entry writes it."""
    entry = tmp_path / "registry" / "r1" / "t0007"
    entry.mkdir(parents=True)
    (entry / "artifact.h5").write_bytes(b"released bytes")
    packet = packet or {"search": {"revision": "r1"}, "lineage": {"what_ran": {"trainer": trainer_identity(BUILTIN), "params": {"lr": 0.1}, "seed": 7}}}
    (entry / "packet.json").write_text(json.dumps(packet))
    record = {"artifact_sha256": file_digest(entry / "artifact.h5"), "packet_digest": digest_of(packet), "trial_id": "t0007"}
    (entry / "registered.json").write_text(json.dumps(record))
    return entry


def test_a_released_baseline_is_read_from_its_registry_entry_and_pinned(tmp_path):
    entry = _entry(tmp_path)
    given = {"name": "prod", "trainer": None, "params": {}}
    for path in (entry, entry / "artifact.h5"):  # the entry, or its artifact
        b = resolve({**given, "artifact": str(path)}, SEARCH)
        assert b.kind is BaselineKind.ARTIFACT and b.params == {"lr": 0.1} and b.target == BUILTIN
        assert b.artifact == ReleasedArtifact(
            str(entry / "artifact.h5"),
            file_digest(entry / "artifact.h5"),
            digest_of(json.loads((entry / "packet.json").read_text())),
            "r1",
            "t0007",
            7,
            trainer_identity(BUILTIN),
        )
        pinned = b.to_json(trainer_identity(BUILTIN))
        assert pinned["trainer"] == trainer_identity(BUILTIN) and pinned["artifact"]["sha256"] == b.artifact.sha256
        assert Baseline.pinned(json.loads(json.dumps(pinned)), trainer_identity(BUILTIN)) == b


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda e: (e / "registered.json").unlink(), "is not a registered release packet"),
        (lambda e: (e / "artifact.h5").write_bytes(b"other bytes"), "its registry record says"),
        (lambda e: (e / "packet.json").write_text("{}"), "packet.json is not the packet that was registered"),
    ],
)
def test_a_released_baseline_that_is_not_what_was_registered_is_refused(tmp_path, damage, needle):
    entry = _entry(tmp_path)
    damage(entry)
    with pytest.raises(UsageError, match=needle):
        resolve({"name": "prod", "artifact": str(entry)}, SEARCH)


def test_a_released_baseline_whose_trainer_no_longer_imports_is_refused(tmp_path):
    gone = {"target": "gone_module:Model", "unit": "step", "source_digest": "sha256:0"}
    entry = _entry(tmp_path, {"search": {"revision": "r1"}, "lineage": {"what_ran": {"trainer": gone, "params": {}, "seed": 0}}})
    with pytest.raises(UsageError, match="module gone_module does not import"):
        resolve({"name": "prod", "artifact": str(entry)}, SEARCH)


def test_the_baseline_trainer_is_the_pinned_code_with_its_declared_defaults(tmp_path):
    b = resolve({**LOGREG, "params": {"lr": 0.5}}, SEARCH)
    trainer, params = baseline_trainer(b, tmp_path)  # the built-in trainer: part of the image, no copy
    assert isinstance(trainer, NumpyMLP) and params == {"lr": 0.5, "hidden": 0, "l2": 0.0, "batch_size": 64}
    edited = Baseline(b.name, b.kind, {**b.trainer, "source_digest": "sha256:other"}, b.params)
    with pytest.raises(GovernanceRefusal) as refused:
        baseline_trainer(edited, tmp_path)
    assert str(refused.value.outcome) == "reject:baseline_trainer"
