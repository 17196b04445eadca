"""Contract freezing, digests and the admission outcomes (pure decisions plus the one frozen file)."""

import json
import os

import pytest

from parcel_hpc.errors import CorruptRecord
from parcel_hpc.governance.admission import TrialIdentity, WorkerObservation, admit, check_worker
from parcel_hpc.governance.contract import Contract, first_difference, freeze_contract, load_contract
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

FIELDS = {
    "snapshot_digest": "sha256:" + "a" * 64,
    "split_digest": "sha256:" + "b" * 64,
    "split_method": "group",
    "metric_revision": "miss-cost-r3",
    "search_revision": "parcel-search-r1",
    "image_digest": "sha256:" + "c" * 64,
    "trainer": {"target": "parcel_hpc.trainer.numpy_mlp:NumpyMLP", "unit": "step", "source_digest": "sha256:" + "e" * 64},
    "space": {"revision": "space-r4", "params": {"lr": {"type": "loguniform", "low": 0.001, "high": 0.3}}},
    "resources": {"gpus": 1, "cpus": 1},
}


def identity(contract, **changes):
    base = TrialIdentity.for_contract("t0001", contract)
    return TrialIdentity(**{**base.__dict__, **changes})


def test_digest_is_canonical_and_content_only():
    a = Contract(FIELDS)
    b = Contract(dict(reversed(list(FIELDS.items()))))
    assert a.digest == b.digest and a.digest.startswith("sha256:")
    assert Contract({**FIELDS, "resources": {"gpus": 2, "cpus": 1}}).digest != a.digest


def test_contract_without_identity_fields_is_refused():
    with pytest.raises(GovernanceRefusal) as err:
        Contract({k: v for k, v in FIELDS.items() if k != "image_digest"})
    assert str(err.value.outcome) == "reject:identity"


@pytest.mark.parametrize("field", ["snapshot_digest", "split_digest", "metric_revision", "search_revision"])
def test_admission_names_the_differing_field(field):
    c = Contract(FIELDS)
    assert admit(identity(c), c) == Outcome.ADMIT
    assert str(admit(identity(c, **{field: "other"}), c)) == f"reject:{field}"


def test_admission_order_is_snapshot_split_metric_search():
    c = Contract(FIELDS)
    every = identity(c, snapshot_digest="x", split_digest="x", metric_revision="x", search_revision="x")
    assert str(admit(every, c)) == "reject:snapshot_digest"
    assert str(admit(identity(c, split_digest="x", metric_revision="x", search_revision="x"), c)) == "reject:split_digest"
    assert str(admit(identity(c, metric_revision="x", search_revision="x"), c)) == "reject:metric_revision"


@pytest.mark.parametrize("missing", ["trial_id", "image_digest"])
def test_admission_rejects_missing_identity(missing):
    c = Contract(FIELDS)
    assert str(admit(identity(c, **{missing: ""}), c)) == "reject:identity"


@pytest.mark.parametrize("field", ["snapshot_digest", "split_digest", "metric_revision", "search_revision"])
@pytest.mark.parametrize("missing", ["trial_id", "image_digest"])
def test_a_differing_pinned_field_is_named_before_a_missing_identity(field, missing):
    """The trial-lineage tutorial's order: pinned fields first, identity only after them."""
    c = Contract(FIELDS)
    assert str(admit(identity(c, **{field: "other", missing: ""}), c)) == f"reject:{field}"


def test_the_tutorials_random_split_trial_is_rejected_by_split_digest():
    c = Contract(FIELDS)
    trial = identity(c, trial_id="parcel-trial-82")
    assert admit(trial, c) == Outcome.ADMIT
    assert str(admit(identity(c, trial_id="parcel-trial-82", split_digest="random-r7"), c)) == "reject:split_digest"
    # A missing image with every pinned field equal is an identity problem, not an image mismatch.
    assert str(admit(identity(c, image_digest=""), c)) == "reject:identity"


def test_admission_rejects_another_image():
    c = Contract(FIELDS)
    assert str(admit(identity(c, image_digest="sha256:" + "d" * 64), c)) == "reject:image_digest"


def test_worker_check_compares_what_it_opened():
    c = Contract(FIELDS)
    ok = WorkerObservation(FIELDS["snapshot_digest"], FIELDS["split_digest"], "group", FIELDS["image_digest"], FIELDS["trainer"])
    assert check_worker(ok, c) == Outcome.ADMIT
    assert str(check_worker(WorkerObservation("sha256:new", ok.split_digest, "group", ok.image_digest, ok.trainer), c)) == "reject:snapshot_digest"
    assert str(check_worker(WorkerObservation(ok.snapshot_digest, "sha256:rnd", "random", ok.image_digest, ok.trainer), c)) == "reject:split_digest"
    assert str(check_worker(WorkerObservation(ok.snapshot_digest, ok.split_digest, "group", "sha256:newer", ok.trainer), c)) == "reject:image_digest"
    edited = {**FIELDS["trainer"], "source_digest": "sha256:" + "f" * 64}
    assert str(check_worker(WorkerObservation(ok.snapshot_digest, ok.split_digest, "group", ok.image_digest, edited), c)) == "reject:trainer"
    assert str(check_worker(WorkerObservation(ok.snapshot_digest, ok.split_digest, "group", ok.image_digest, {}), c)) == "reject:trainer"


def test_first_difference_follows_pinned_order_then_names():
    frozen = {**FIELDS, "zeta": 1, "alpha": 1}
    assert first_difference(frozen, frozen) is None
    assert first_difference(frozen, {**frozen, "alpha": 2, "zeta": 2}) == "alpha"
    assert first_difference(frozen, {**frozen, "resources": {"gpus": 2, "cpus": 1}, "metric_revision": "m"}) == "metric_revision"
    assert first_difference(frozen, {k: v for k, v in frozen.items() if k != "zeta"}) == "zeta"


def test_freeze_once_then_match_or_refuse(tmp_path):
    c = Contract(FIELDS)
    frozen, created = freeze_contract(tmp_path, c)
    assert created and frozen.digest == c.digest
    before = (tmp_path / "contract.json").read_bytes()
    again, created = freeze_contract(tmp_path, Contract(dict(FIELDS)))
    assert not created and again.digest == c.digest
    with pytest.raises(GovernanceRefusal) as err:
        freeze_contract(tmp_path, Contract({**FIELDS, "split_digest": "sha256:" + "e" * 64}))
    assert str(err.value.outcome) == "reject:split_digest"
    assert "new search.revision" in err.value.detail
    assert (tmp_path / "contract.json").read_bytes() == before  # never rewritten
    assert oct(os.stat(tmp_path / "contract.json").st_mode & 0o777) == "0o644"


def test_edited_contract_file_is_detected(tmp_path):
    freeze_contract(tmp_path, Contract(FIELDS))
    path = tmp_path / "contract.json"
    obj = json.loads(path.read_text())
    obj["contract"]["metric_revision"] = "miss-cost-r4"
    path.write_text(json.dumps(obj))
    with pytest.raises(CorruptRecord):
        load_contract(tmp_path)


def test_every_outcome_token_is_one_type_parsed_and_printed_in_one_place():
    from parcel_hpc.governance.outcome import GovernanceRefusal

    for token in ("admit", "reject:image_digest", "hold:budget", "hold:slice-quality", "evaluate:final-holdout", "release:registered"):
        assert str(Outcome.parse(token)) == token
    assert Outcome.parse("hold:budget") == Outcome.HOLD_BUDGET and Outcome.HOLD_BUDGET.is_refusal and Outcome.HOLD_BUDGET.exit_code == 3
    assert Outcome.reject("split_digest").is_reject and Outcome.EVALUATE_FINAL.exit_code == 0 and Outcome.ADMIT.is_admit
    for bad in ("", "admit:x", "reject", "reject:", "maybe:x", "hold:Budget", "hold:a b"):
        with pytest.raises(ValueError):
            Outcome.parse(bad)
    assert GovernanceRefusal("reject:cancelled", "why").outcome == Outcome.reject("cancelled")  # a user's token is parsed
    with pytest.raises(ValueError):
        GovernanceRefusal("stop", "not an outcome")


def test_a_refusal_ends_with_its_outcome_first_on_stdout_and_exit_3(capsys):
    """``GovernanceRefusal`` lives beside ``Outcome``; ``errors.exit_on_error`` prints its headline
    (the outcome) on stdout, the detail on stderr on one line, and exits 3."""
    from parcel_hpc.errors import exit_on_error
    from parcel_hpc.governance.outcome import GovernanceRefusal

    for refusal, err in (
        (GovernanceRefusal(Outcome.HOLD_BUDGET, "the cap\nis spent"), "hold:budget: the cap is spent\n"),
        (GovernanceRefusal("reject:image_digest"), ""),
    ):
        with pytest.raises(SystemExit) as ended, exit_on_error():
            raise refusal
        assert ended.value.code == 3 and capsys.readouterr() == (f"{refusal.outcome}\n", err)
