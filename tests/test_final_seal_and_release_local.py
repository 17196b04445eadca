"""The final evaluation and the release on a hostile shared root (issue 32, High 3 and Medium 9;
issue 43): a registry entry someone planted is refused, never said to be registered, and left as
it was; so is a registry folder someone else made or may write, and an entry whose code copy gained
bytecode, by ``release`` and by ``load_release`` before it imports anything; moving ``selection/``
aside, or the seal files themselves, cannot buy a second final evaluation. The selection jobs run
from a folder holding a copy of parcel_hpc (a checkout) and import the installed one all the same."""

import hashlib
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parcel_hpc.testing import decide_every_hold, launch, parcel_hpc
from parcel_hpc.testing.users import BOB, ensure_users

PARCEL_HPC = Path(sys.executable).parent / "parcel-hpc"  # the console script: its own folder first on sys.path, not the working directory's
MODEL = "from parcel_hpc.trainer.numpy_mlp import NumpyMLP\n\n\nclass Model(NumpyMLP):\n    pass\n"


pytestmark = pytest.mark.xdist_group("final-seal-and-release-local")  # one worker runs the module: the evaluated search once, not once a worker


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, artifacts):
    """A small search of the user's own trainer (its code copied into the search and the registry),
    selected, decided when held, and evaluated on its final partition once. select and
    evaluate-final run from a folder holding an edited copy of parcel_hpc, as a checkout beside the
    runs would: their jobs must import the installed parcel_hpc (its image digest) all the same."""
    root = tmp_path_factory.mktemp("seal")
    data = root / "data"
    shutil.copytree(artifacts["dir"], data)
    (root / "lab" / "my_models").mkdir(parents=True)
    (root / "lab" / "my_models" / "__init__.py").write_text("from my_models.model import Model\n")
    (root / "lab" / "my_models" / "model.py").write_text(MODEL)
    installed = Path(__import__("parcel_hpc").__file__).parent
    checkout = root / "checkout"
    shutil.copytree(installed, checkout / "parcel_hpc", ignore=shutil.ignore_patterns("__pycache__"))
    with open(checkout / "parcel_hpc" / "governance" / "image.py", "a") as f:  # inside what the computed image digest hashes
        f.write("# a checkout's copy, edited: its image digest is not the installed one's\n")
    res = launch(
        [
            f"search.root={root / 'runs'}",
            "search.revision=seal-r1",
            "search.n_trials=12",
            "budget.max_trials=12",
            "pruner=none",
            "trainer.target=my_models:Model",
        ],
        cwd=root,
        data_dir=data,
        env=ENV(root),
    )
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "seal-r1"
    sel = from_checkout(root, "select", str(search))
    ended = decide_every_hold(sel, lambda reason: cli(root, "decide", str(search), "--accept", "--by", "Dana Reviewer", "--reason", reason))
    assert ended.returncode == 0 and ended.stdout.splitlines()[0] == "evaluate:final-holdout", ended.stdout + ended.stderr
    final = from_checkout(root, "evaluate-final", str(search))
    assert final.returncode == 0 and final.stdout.splitlines()[0] == "evaluate:final-holdout", final.stdout + final.stderr
    return {"root": root, "search": search, "data": data}


def ENV(root):
    return {"PYTHONPATH": str(root / "lab")}


def cli(root, *args):
    return parcel_hpc([*args], cwd=root, timeout=600, env=ENV(root))


def from_checkout(root, *args):
    """The command run from the folder holding the edited copy of parcel_hpc (as a user in their checkout)."""
    return subprocess.run([str(PARCEL_HPC), *args], cwd=root / "checkout", env={**os.environ, **ENV(root)}, capture_output=True, text=True, timeout=600)


def load(root, entry, marker=None):
    """``load_release`` in a fresh interpreter, as a server would; one line and exit 2 when refused."""
    code = (
        "import sys; from parcel_hpc.errors import exit_on_error; from parcel_hpc.release import load_release\n"
        "with exit_on_error():\n"
        "    model = load_release(sys.argv[1])\n"
        "print(len(model.serve(__import__('parcel_hpc.data', fromlist=['x']).load_partition(sys.argv[2], __import__('parcel_hpc.data', fromlist=['x']).read_split(sys.argv[3]), 'validation').images[:4])))\n"
    )
    data = root / "data"
    return subprocess.run(
        [sys.executable, "-c", code, str(entry), str(data / "parcels.h5"), str(data / "split-group_r8.json")],
        cwd=root,
        env={**os.environ, **ENV(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def registered_entry(evaluated):
    root, search = evaluated["root"], evaluated["search"]
    rel = cli(root, "release", str(search))
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    result = json.loads((search / "final-result.json").read_text())
    return root / "runs" / "registry" / "seal-r1" / result["trial_id"]


def one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_a_registry_folder_someone_else_made_or_opened_is_refused(evaluated):
    """Run before this module's first release (a registered selection is said again, not rewritten)."""
    ensure_users()
    root, search = evaluated["root"], evaluated["search"]
    planted = root / "planted-registry"
    planted.mkdir()
    os.chown(planted, __import__("pwd").getpwnam(BOB).pw_uid, -1)  # what bob made first, where the release would go
    res = cli(root, "release", str(search), "--registry", str(planted))
    assert res.returncode == 2, res.stdout + res.stderr
    line = one_line(res)
    assert f"registry {planted}: {planted} is owned by {BOB}" in line and "pass --registry DIR" in line, line
    assert os.listdir(planted) == []
    opened = root / "open-registry"
    opened.mkdir()
    os.chmod(opened, 0o775)
    res = cli(root, "release", str(search), "--registry", str(opened))
    assert res.returncode == 2 and f"{opened} is writable by its group or others (mode 0775)" in one_line(res), res.stderr
    assert os.listdir(opened) == [] and not (search / "release").exists()


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
    released = (entry / "artifact.h5").read_bytes()
    (entry / "artifact.h5").write_bytes(b"replaced later")
    tampered = cli(root, "release", str(search))
    (entry / "artifact.h5").write_bytes(released)  # restored for the tests after this one
    assert tampered.returncode == 3 and tampered.stdout.splitlines()[0] == "reject:registry-entry", tampered.stdout + tampered.stderr
    assert "artifact.h5 is not the artifact the final evaluation scored" in tampered.stderr


def test_bytecode_in_a_registry_entry_is_refused_by_release_and_load_release(evaluated):
    root, search = evaluated["root"], evaluated["search"]
    entry = registered_entry(evaluated)
    marker = root / "entry-bytecode-ran"
    digest = json.loads((entry / "packet.json").read_text())["lineage"]["what_ran"]["trainer"]["source_digest"]
    pyc = entry / "code" / digest.partition(":")[2] / "my_models" / "__pycache__" / f"model.{sys.implementation.cache_tag}.pyc"
    evil = root / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\nfrom parcel_hpc.trainer.numpy_mlp import NumpyMLP as Model\n")
    pyc.parent.mkdir()
    py_compile.compile(str(evil), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True)
    again = cli(root, "release", str(search))
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "reject:registry-entry", again.stdout + again.stderr
    assert f"holds my_models/__pycache__/{pyc.name}, which is not in its digest" in again.stderr and "already registered" not in again.stdout
    loaded = load(root, entry)
    assert loaded.returncode == 2 and f"holds my_models/__pycache__/{pyc.name}, which is not in its digest" in one_line(loaded), loaded.stderr
    assert not marker.exists()
    pyc.unlink()
    pyc.parent.rmdir()
    # A registry whose revision folder someone else owns could have been swapped: not loaded either.
    os.chown(entry.parent, __import__("pwd").getpwnam(BOB).pw_uid, -1)
    try:
        swapped = load(root, entry)
        assert swapped.returncode == 2 and f"{entry.parent} is owned by {BOB}" in one_line(swapped), swapped.stderr
    finally:
        os.chown(entry.parent, os.getuid(), -1)
    served = load(root, entry)
    assert served.returncode == 0 and served.stdout.strip() == "4", served.stdout + served.stderr
    assert not marker.exists()
    # The entry is an MLflow model: MLflow's loader, in a fresh process given the folder, answers as load_release does.
    code = (
        "import sys, numpy as np, mlflow.pyfunc; from parcel_hpc.release import load_release; frames = np.load(sys.argv[2])\n"
        "assert np.array_equal(mlflow.pyfunc.load_model(sys.argv[1]).predict(frames), load_release(sys.argv[1]).serve(frames)); print('same')\n"
    )
    example = np.asarray(json.loads((entry / "input_example.json").read_text()), dtype=np.float32)
    np.save(root / "example.npy", example)
    same = subprocess.run(
        [sys.executable, "-c", code, str(entry), str(root / "example.npy")],
        cwd=root,
        env={**os.environ, **ENV(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert same.returncode == 0 and same.stdout.strip() == "same", same.stdout + same.stderr[-2000:]
    # An MLmodel edited to name another loader (what mlflow.pyfunc.load_model would import) is refused before anything is imported.
    (root / "planted_loader.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n_load_pyfunc = None\n")
    released = (entry / "MLmodel").read_text()
    (entry / "MLmodel").write_text(released.replace("loader_module: parcel_hpc.release.pyfunc", "loader_module: planted_loader"))
    try:
        planted = load(root, entry)
        assert planted.returncode == 2 and f"{entry / 'MLmodel'} is not the file registered.json registered" in one_line(planted), planted.stderr
        again = cli(root, "release", str(search))
        assert again.returncode == 3 and again.stdout.splitlines()[0] == "reject:registry-entry", again.stdout + again.stderr
    finally:
        (entry / "MLmodel").write_text(released)
    (entry / "conda.yaml").with_name("extra.py").write_text("")  # a file the marker does not list
    try:
        added = load(root, entry)
        assert added.returncode == 2 and f"{entry} holds extra.py, which registered.json does not list" in one_line(added), added.stderr
    finally:
        (entry / "extra.py").unlink()
    assert not marker.exists()


def snapshot(directory):
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_moving_the_seal_files_aside_cannot_buy_a_second_final_evaluation(evaluated):
    """The owner's own tampering, as far as files can hold it: the claim beside the contract and the
    sealed result moved aside still find the claim's copy in trials/; that moved too, the selection
    journal still records the evaluation."""
    root, search = evaluated["root"], evaluated["search"]
    moved = [search / "final-claim.json", search / "final-result.json", search / "trials" / ".final-claim.json"]
    try:
        for p in moved[:2]:
            p.rename(p.with_name(p.name + ".aside"))
        ev = cli(root, "evaluate-final", str(search))
        assert ev.returncode == 3 and ev.stdout.splitlines()[0] == "reject:final-holdout-used", ev.stdout + ev.stderr
        moved[2].rename(moved[2].with_name(moved[2].name + ".aside"))
        ev = cli(root, "evaluate-final", str(search))
        assert ev.returncode == 3 and ev.stdout.splitlines()[0] == "reject:final-holdout-used", ev.stdout + ev.stderr
        assert "the selection journal" in ev.stderr and "final-claim.json is gone" in ev.stderr, ev.stderr
        assert not (search / "final-result.json").exists()  # nothing was evaluated again
    finally:
        for p in moved:
            if p.with_name(p.name + ".aside").exists():
                p.with_name(p.name + ".aside").rename(p)


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
