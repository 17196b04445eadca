"""A checkpoint prefix, a claim or a quarantine never touches another search's files: a
``checkpoint.dir`` another search writes to is refused at the launch (exit 2, one line, nothing
written), and a claim names its search, so a directory another search holds is never taken over
or moved (issue 32, High 4)."""

import json

from parcel_hpc.checkpoints import claims, owner
from parcel_hpc.checkpoints.claims import CheckpointCollision, ClaimIdentity, ClaimOutcome, claim_directory
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.testing import launch, parcel_hpc

TRIAL = TrialIdentity("t0000", "sha256:" + "1" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64)
SEARCH_A, SEARCH_B = "a" * 32, "b" * 32


def test_two_revisions_on_one_checkpoint_dir_the_second_is_refused_and_the_first_still_selects(tmp_path, data_dir):
    shared = tmp_path / "shared-checkpoints"
    common = [f"search.root={tmp_path / 'runs'}", f"checkpoint.dir={shared}", "search.n_trials=4", "budget.max_trials=4", "pruner=none"]
    first = launch([*common, "search.revision=ck-r1"], cwd=tmp_path, data_dir=data_dir)
    assert first.returncode == 0, first.stderr[-2000:]
    marked = json.loads((shared / owner.OWNER_FILE).read_text())
    assert marked["search"] == str(tmp_path / "runs" / "ck-r1") and len(marked["search_id"]) == 32
    before = sorted(p.relative_to(shared) for p in shared.rglob("*"))

    second = launch([*common, "search.revision=ck-r2"], cwd=tmp_path, data_dir=data_dir)
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr.count("\n") == 1 and second.stderr.startswith("error: checkpoint.dir="), second.stderr
    assert str(tmp_path / "runs" / "ck-r1") in second.stderr and "own checkpoint.dir" in second.stderr
    assert not (tmp_path / "runs" / "ck-r2").exists()  # nothing written for it
    assert sorted(p.relative_to(shared) for p in shared.rglob("*")) == before  # nor in the shared directory

    # The first search's checkpoints are where it left them: its selection finds its winner intact.
    sel = parcel_hpc(["select", str(tmp_path / "runs" / "ck-r1")], cwd=tmp_path, timeout=600)
    assert sel.stdout.splitlines()[0] in ("hold:performance", "hold:slice-quality", "evaluate:final-holdout"), sel.stdout + sel.stderr
    assert "no intact checkpoint" not in sel.stdout + sel.stderr


def test_a_directory_marked_by_another_search_is_refused_and_ones_own_is_not():
    mine = owner.DirOwner("/runs/r1", SEARCH_A, "sha256:c1")
    assert owner.problem(None, None, mine) is None
    assert owner.problem(mine, None, mine) is None  # a relaunch of the same search
    assert "search /runs/r2" in owner.problem(owner.DirOwner("/runs/r2", SEARCH_B, "sha256:c2"), None, mine)
    # A new search (no id yet) at the path a moved-aside search marked is another search.
    assert owner.problem(mine, None, owner.DirOwner("/runs/r1", "", "sha256:c1")) is not None
    # A directory from before marks: judged by the contract its claims name.
    assert owner.problem(None, "sha256:c1", mine) is None
    assert "contract sha256:c9" in owner.problem(None, "sha256:c9", mine)


def test_a_claim_of_another_search_is_never_taken_over_even_for_the_same_trial(tmp_path):
    """The same revision in two roots: one trial id, config and contract, two searches."""
    theirs = ClaimIdentity(TRIAL, "", 1, "elsewhere-node", 12345, SEARCH_A)
    claim_directory(tmp_path, theirs, is_alive=lambda r: False)
    ours = ClaimIdentity(TRIAL, "", 2, "this-node", 23456, SEARCH_B)
    existing = claims.read_claim(tmp_path)
    assert existing.search_id == SEARCH_A
    # Without the search id, a later attempt of a dead holder would take the directory over.
    assert claims.decide_claim(existing, ClaimIdentity(TRIAL, "", 2, "this-node", 23456), holder_alive=False) is ClaimOutcome.TAKEN_OVER
    assert claims.decide_claim(existing, ours, holder_alive=False) is ClaimOutcome.FOREIGN_SEARCH
    try:
        claim_directory(tmp_path, ours, is_alive=lambda r: False)
    except CheckpointCollision as exc:
        assert exc.other_search == f"search {SEARCH_A}" and SEARCH_B in exc.reason
    else:
        raise AssertionError("another search's claim was taken over")
    assert claims.read_claim(tmp_path).search_id == SEARCH_A and claims.read_claim(tmp_path).generation == 0
