"""The final evaluation and the release on a hostile shared root (issue 32, High 3 and Medium 9):
a registry entry someone planted is refused, never said to be registered, and left as it was;
moving ``selection/`` aside and selecting afresh cannot buy a second final evaluation, because
the revision's final claim and sealed result sit beside the contract."""

import hashlib
import json
import shutil

import pytest

from parcel_hpc.testing import launch, parcel_hpc


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, artifacts):
    """A small search, selected, decided when held, and evaluated on its final partition once."""
    root = tmp_path_factory.mktemp("seal")
    data = root / "data"
    shutil.copytree(artifacts["dir"], data)
    res = launch(
        [f"search.root={root / 'runs'}", "search.revision=seal-r1", "search.n_trials=12", "budget.max_trials=12", "pruner=none"], cwd=root, data_dir=data
    )
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "seal-r1"
    sel = cli(root, "select", str(search))
    if sel.stdout.splitlines()[0] == "hold:slice-quality":
        ok = cli(root, "decide", str(search), "--accept", "--by", "Dana Reviewer", "--reason", "accepted for the test")
        assert ok.returncode == 0, ok.stdout + ok.stderr
    else:
        assert sel.returncode == 0 and sel.stdout.splitlines()[0] == "evaluate:final-holdout", sel.stdout + sel.stderr
    final = cli(root, "evaluate-final", str(search))
    assert final.returncode == 0 and final.stdout.splitlines()[0] == "evaluate:final-holdout", final.stdout + final.stderr
    return {"root": root, "search": search}


def cli(root, *args):
    return parcel_hpc([*args], cwd=root, timeout=600)


def snapshot(directory):
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_a_planted_registry_entry_is_refused_and_left_untouched(evaluated):
    root, search = evaluated["root"], evaluated["search"]
    result = json.loads((search / "final-result.json").read_text())
    entry = root / "runs" / "registry" / "seal-r1" / result["trial_id"]
    # What a hostile user of the shared registry writes first: an entry naming this trial, and an artifact of theirs.
    entry.mkdir(parents=True)
    (entry / "artifact.h5").write_bytes(b"planted model")
    planted = {"artifact_sha256": "sha256:" + hashlib.sha256(b"planted model").hexdigest(), "packet_digest": "sha256:0", "trial_id": result["trial_id"]}
    (entry / "registered.json").write_text(json.dumps(planted))
    before = snapshot(entry)
    rel = cli(root, "release", str(search))
    assert rel.returncode == 3, rel.stdout + rel.stderr
    assert rel.stdout.splitlines()[0] == "reject:registry-entry" and "release:registered" not in rel.stdout
    assert rel.stderr.count("\n") == 1 and str(entry) in rel.stderr and "move it aside" in rel.stderr, rel.stderr
    assert snapshot(entry) == before  # the registry untouched
    assert not (search / "release").exists()  # and nothing written beside the search

    # Moved aside, the release registers its own entry; said again, it is verified, not trusted.
    entry.rename(entry.with_name(entry.name + ".planted"))
    ok = cli(root, "release", str(search))
    assert ok.returncode == 0 and ok.stdout.splitlines()[0] == "release:registered", ok.stdout + ok.stderr
    registered = json.loads((entry / "registered.json").read_text())
    assert registered["selection"] == result["selection"] and registered["trial_id"] == result["trial_id"]
    assert registered["artifact_sha256"] == result["winner"]["artifact_sha256"] and len(registered["search_id"]) == 32
    again = cli(root, "release", str(search))
    assert again.returncode == 0 and again.stdout.splitlines()[0] == "release:registered"
    # An entry whose artifact was replaced after it was registered is never said to be registered again.
    (entry / "artifact.h5").write_bytes(b"replaced later")
    tampered = cli(root, "release", str(search))
    assert tampered.returncode == 3 and tampered.stdout.splitlines()[0] == "reject:registry-entry", tampered.stdout + tampered.stderr
    assert "artifact.h5 is not the artifact the final evaluation scored" in tampered.stderr


def test_moving_the_selection_aside_cannot_buy_a_second_final_evaluation(evaluated):
    root, search = evaluated["root"], evaluated["search"]
    sealed = (search / "final-result.json").read_bytes()
    (search / "selection").rename(search / "selection.moved-aside")
    # The attack: a fresh select, decide and evaluate-final.
    sel = cli(root, "select", str(search))
    assert sel.returncode == 3 and sel.stdout.splitlines()[0] == "reject:final-holdout-used", sel.stdout + sel.stderr
    assert "final-claim.json" in sel.stderr and sel.stderr.count("\n") == 1
    assert not (search / "selection" / "selection-1.json").exists()
    dec = cli(root, "decide", str(search), "--accept", "--by", "Mallory", "--reason", "again")
    assert dec.returncode == 3 and dec.stdout.splitlines()[0] == "reject:final-holdout-used", dec.stdout + dec.stderr
    ev = cli(root, "evaluate-final", str(search))
    assert ev.returncode == 3 and ev.stdout.splitlines()[0] == "reject:final-holdout-used", ev.stdout + ev.stderr
    assert "its result is sealed" in ev.stderr
    assert (search / "final-result.json").read_bytes() == sealed  # the first result stands
