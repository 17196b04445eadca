"""The approved baseline is the team's: real launches on the local executor, then select, decide,
evaluate-final and release, with (a) the demo's logistic baseline under a user's own model,
(b) a baseline trainer and params of its own (another class than the search's), (c) an artifact an
earlier release registered. Every refusal is one line: at the launch (exit 2, nothing written), at
release (exit 3, the hold first), and a user trainer's KeyError inside the rerun job."""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.image import file_digest
from parcel_hpc.testing import decide_every_hold, launch, parcel_hpc
from parcel_hpc.trainer import BUILTIN

# A newcomer's model whose parameters are named its own way (as an MLPClassifier's are).
USER_TRAINER = '''
from parcel_hpc.trainer.numpy_mlp import NumpyMLP
from parcel_hpc.trainer.params import Param


class WidthMLP(NumpyMLP):
    parameters = {"width": Param(int), "rate": Param(float), "alpha": Param(float, default=0.0)}

    def build(self, params, seed, data):
        super().build({"lr": params["rate"], "hidden": params["width"], "l2": params["alpha"], "batch_size": 64}, seed, data)


class Timid(WidthMLP):
    """A weak approved model: it rarely asks for a review, so it misses most damage."""

    def _probabilities(self, x):
        return 0.01 * super()._probabilities(x)


class ReadsUndeclared(WidthMLP):
    def build(self, params, seed, data):
        super().build(params, seed, data)
        self.depth = params["depth"]  # a parameter it never declared: the launch's preflight finds it


class FailsLate(WidthMLP):
    def step(self):
        if self.steps_done == 40:  # past the preflight's one step: only the rerun job meets it
            raise KeyError("depth")
        return super().step()
'''
USER_SPACE = """revision: width-r1
params:
  width: {type: choice, values: [0, 16]}
  rate: {type: loguniform, low: 0.003, high: 0.3}
"""
SMALL = ["search.n_trials=2", "budget.max_trials=2", "pruner=none"]
LOGREG = {"lr": 0.01, "hidden": 0, "l2": 0.001, "batch_size": 64}  # conf/selection/baseline/logreg_approved.yaml
WEAK = ["selection/baseline=given", "selection.baseline.name=timid-approved", "selection.baseline.trainer=width_mlp:Timid"]
WEAK_PARAMS = "+selection.baseline.params={width: 0, rate: 0.01}"


pytestmark = pytest.mark.xdist_group("baseline-local")  # one worker runs the module: the searches its fixtures run once, not once a worker


@pytest.fixture(scope="module")
def root(tmp_path_factory, artifacts) -> Path:
    root = tmp_path_factory.mktemp("baseline")
    shutil.copytree(artifacts["dir"], root / "data")
    (root / "width_mlp.py").write_text(USER_TRAINER)
    (root / "my_conf" / "space").mkdir(parents=True)
    (root / "my_conf" / "space" / "width_r1.yaml").write_text(USER_SPACE)
    return root


def env(root: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))}


def run_launch(root: Path, revision: str, *overrides: str):
    return launch([f"search.root={root / 'runs'}", f"search.revision={revision}", *SMALL, *overrides], cwd=root, data_dir=root / "data", env=env(root))


def cli(root: Path, *args: str):
    return parcel_hpc([*args], cwd=root, env=env(root), timeout=600)


def contract(search: Path) -> dict:
    return json.loads((search / "contract.json").read_text())["contract"]


def rerun_result(search: Path) -> dict:
    return json.loads((search / "selection" / "1" / "rerun" / "result.json").read_text())


def no_traceback(res) -> None:
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr


def select_and_decide(root: Path, search: Path) -> str:
    """select, then decide each hold a decision may lift; the disposition it ends with."""
    sel = cli(root, "select", str(search))
    no_traceback(sel)
    ended = decide_every_hold(sel, lambda reason: cli(root, "decide", str(search), "--accept", "--by", "Dana Reviewer", "--reason", reason))
    return ended.stdout.splitlines()[0]


def release_flow(root: Path, search: Path) -> tuple[dict, object]:
    """evaluate-final then release on a selection that may read the final partition."""
    final = cli(root, "evaluate-final", str(search))
    assert final.returncode == 0 and final.stdout.splitlines()[0] == "evaluate:final-holdout", final.stdout + final.stderr
    rel = cli(root, "release", str(search))
    no_traceback(rel)
    return json.loads((search / "release" / "packet.json").read_text()), rel


@pytest.fixture(scope="module")
def released(root) -> Path:
    """(b): the built-in model searched, compared with a weak baseline of another trainer class,
    its own params exactly; selected, evaluated once and registered (the baseline of (c))."""
    res = run_launch(root, "own-baseline", *WEAK, WEAK_PARAMS)
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "own-baseline"
    sel = cli(root, "select", str(search))
    assert sel.returncode == 3 and sel.stdout.splitlines()[0] == "hold:slice-quality", sel.stdout + sel.stderr  # crushed_corner's min_recall
    held = cli(root, "release", str(search))
    no_traceback(held)
    assert held.returncode == 3 and held.stdout.splitlines() == ["hold:slice-quality"], held.stdout
    assert held.stderr.count("\n") == 1 and "parcel-hpc decide" in held.stderr and not (search / "release").exists()
    # Selected but not evaluated: release holds on the final check (the packet says why).
    assert select_and_decide(root, search) == "evaluate:final-holdout"
    early = cli(root, "release", str(search))
    no_traceback(early)
    assert early.returncode == 3 and early.stdout.splitlines()[0] == "hold:final-not-evaluated", early.stdout
    packet, rel = release_flow(root, search)
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    return Path(packet["registry_path"])


def test_a_baseline_trainer_of_its_own_is_trained_with_exactly_its_params(root, released):
    search = root / "runs" / "own-baseline"
    pinned = contract(search)["selection"]["baseline"]
    assert pinned["name"] == "timid-approved" and pinned["params"] == {"width": 0, "rate": 0.01}  # not merged with the demo's lr/hidden/l2/batch_size
    assert pinned["trainer"]["target"] == "width_mlp:Timid" and pinned["trainer"]["source_digest"].startswith("sha256:")
    result = rerun_result(search)
    assert result["baseline"]["params"] == {"width": 0, "rate": 0.01} and result["baseline"]["trainer"] == "width_mlp:Timid"
    spec = json.loads((Path(result["records"]["baseline"]) / "spec.json").read_text())
    assert spec["params"] == {"width": 0, "rate": 0.01}
    packet = json.loads((search / "release" / "packet.json").read_text())
    concluded = packet["lineage"]["what_was_concluded"]["baseline"]
    assert concluded["kind"] == "trained" and concluded["trainer"]["target"] == "width_mlp:Timid"
    assert packet["lineage"]["what_ran"]["trainer"]["target"] == BUILTIN  # the search's own model is another class
    assert "against baseline timid-approved (trained with `width_mlp:Timid`" in (search / "release" / "packet.md").read_text()
    # A changed baseline is another search: refused against the frozen contract.
    changed = run_launch(root, "own-baseline", *WEAK, "+selection.baseline.params={width: 0, rate: 0.001}")
    assert changed.returncode == 3 and changed.stdout.splitlines()[0] == "reject:selection", changed.stdout + changed.stderr


def test_release_says_a_registered_selection_again_and_writes_nothing(root, released):
    search = root / "runs" / "own-baseline"
    before = {p.name: p.read_bytes() for p in (search / "release").iterdir()}
    again = cli(root, "release", str(search))
    no_traceback(again)
    assert again.returncode == 0 and again.stdout.splitlines()[0] == "release:registered", again.stdout + again.stderr
    assert f"already registered: {released}" in again.stdout
    assert {p.name: p.read_bytes() for p in (search / "release").iterdir()} == before


def test_an_artifact_an_earlier_release_registered_is_the_baseline_as_released(root, released):
    """(c): scored through its trainer's serve, never retrained; its digest pinned."""
    earlier = root / "runs" / "own-baseline"
    res = run_launch(
        root, "vs-released", "selection/baseline=given", "selection.baseline.name=released-own-baseline", f"selection.baseline.artifact={released}"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "vs-released"
    pinned = contract(search)["selection"]["baseline"]
    registered = json.loads((released / "registered.json").read_text())
    assert pinned["artifact"]["sha256"] == registered["artifact_sha256"] == file_digest(released / "artifact.h5")
    assert pinned["artifact"]["path"] == str(released / "artifact.h5") and pinned["trainer"]["target"] == BUILTIN
    assert select_and_decide(root, search) == "evaluate:final-holdout"
    result = rerun_result(search)
    assert "baseline" not in result["records"]  # nothing was trained for it
    assert result["baseline"]["kind"] == "artifact" and result["baseline"]["released"] == f"own-baseline/{registered['trial_id']}"
    # The same search seed proposes the same winner: the released model scores exactly as the winner.
    assert result["baseline"]["metric"] == pytest.approx(rerun_result(earlier)["artifact_metric"], abs=1e-12)
    final = cli(root, "evaluate-final", str(search))
    assert final.returncode == 0, final.stdout + final.stderr
    nowhere = cli(root, "release", str(search), "--registry", "/proc/parcel-registry")  # a registry that cannot be written
    assert nowhere.returncode == 2 and "is not writable" in nowhere.stderr and nowhere.stderr.count("\n") == 1, nowhere.stderr
    assert not (search / "release").exists()
    rel = cli(root, "release", str(search))
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    packet = json.loads((search / "release" / "packet.json").read_text())
    earlier_final = json.loads((earlier / "release" / "packet.json").read_text())["final"]
    assert packet["final"]["baseline"]["metric"] == pytest.approx(earlier_final["winner"]["metric"], abs=1e-12)
    assert packet["final"]["baseline"]["artifact_sha256"] == registered["artifact_sha256"]
    assert packet["lineage"]["what_was_concluded"]["baseline"]["released"]["sha256"] == registered["artifact_sha256"]
    md = (search / "release" / "packet.md").read_text()
    assert f"released own-baseline/{registered['trial_id']} `{registered['artifact_sha256']}`, served by `{BUILTIN}`" in md


def test_a_user_trainer_with_no_baseline_set_is_compared_with_the_approved_logistic_model(root):
    """(a), the newcomer's case: the demo's baseline names its own trainer, so a search of another
    model trains the approved logistic regression with the built-in trainer, never those params in
    the user's trainer (which would have been a KeyError after the whole search)."""
    res = run_launch(root, "newcomer", "trainer.target=width_mlp:WidthMLP", "space=width_r1", f"hydra.searchpath=[file://{root / 'my_conf'}]")
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "newcomer"
    pinned = contract(search)["selection"]["baseline"]
    assert pinned["name"] == "logreg-approved-2026-09" and pinned["params"] == LOGREG and pinned["trainer"]["target"] == BUILTIN
    first = select_and_decide(root, search)
    assert first == "evaluate:final-holdout"
    result = rerun_result(search)
    assert result["baseline"]["trainer"] == BUILTIN and result["baseline"]["params"] == LOGREG
    packet, rel = release_flow(root, search)
    assert rel.returncode == int(packet["outcome"] != "release:registered") * 3 and rel.stdout.splitlines()[0] == packet["outcome"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        # Hydra adds to the group's dict: the demo's params stay, and the one the trainer lacks is named with the fix.
        (["+selection.baseline.params={width: 64}"], "selection.baseline.params names width, which parcel_hpc.trainer.numpy_mlp:NumpyMLP does not take"),
        (["selection.baseline.trainer=width_mlp:WidthMLP", "+selection.baseline.params={width: 8, rate: 0.1}"], "selection/baseline=given"),
        (
            ["selection/baseline=given", "selection.baseline.name=b", "selection.baseline.trainer=width_mlp:WidthMLP", "+selection.baseline.params={width: 8}"],
            "leaves out rate",
        ),
        (["selection.baseline.trainer=no_such_module:Model"], "selection.baseline.trainer=no_such_module:Model: module no_such_module does not import"),
        (["selection/baseline=given", "selection.baseline.name=b", "selection.baseline.artifact=/nonexistent/entry"], "/nonexistent/entry does not exist"),
        (["selection.baseline.artifact=/nonexistent/entry"], "start from the empty group"),
        (["selection/baseline=given", "selection.baseline.name=b", "selection.baseline.artifact=data"], "is not a registered release packet"),
    ],
)
def test_a_baseline_that_cannot_be_used_is_refused_at_the_launch(root, overrides, needle):
    res = run_launch(root, "refused", *overrides)
    assert res.returncode == 2, (overrides, res.stdout, res.stderr)
    assert res.stderr.startswith("error: ") and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (root / "runs" / "refused").exists()


def test_an_edited_registered_artifact_is_refused_at_the_launch(root, released, tmp_path):
    copy = tmp_path / "entry"
    shutil.copytree(released, copy)
    with open(copy / "artifact.h5", "ab") as f:
        f.write(b"\0")
    res = run_launch(root, "edited", "selection/baseline=given", "selection.baseline.name=b", f"selection.baseline.artifact={copy / 'artifact.h5'}")
    assert res.returncode == 2 and "its registry record says" in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert not (root / "runs" / "edited").exists()


def test_release_refuses_a_search_never_selected_or_held_in_one_line(root):
    given = ["selection/baseline=given", "selection.baseline.name=b"]
    res = run_launch(root, "held", *given, "selection.baseline.trainer=width_mlp:ReadsUndeclared")
    # Without params it is refused: it declares width and rate without a default.
    assert res.returncode == 2 and "leaves out rate, width" in res.stderr, res.stderr
    res = run_launch(root, "held", *given, "selection.baseline.trainer=width_mlp:ReadsUndeclared", "+selection.baseline.params={width: 0, rate: 0.01}")
    # Its build reads a parameter it never declared: the preflight finds it before anything is frozen.
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "preflight: width_mlp:ReadsUndeclared fails with the baseline b's parameters {rate=0.01, width=0}: KeyError: 'depth'" in res.stderr
    assert not (root / "runs" / "held").exists()
    res = run_launch(root, "held", *given, "selection.baseline.trainer=width_mlp:FailsLate", "+selection.baseline.params={width: 0, rate: 0.01}")
    assert res.returncode == 0, res.stderr[-2000:]
    search = root / "runs" / "held"
    never = cli(root, "release", str(search))
    no_traceback(never)
    assert never.returncode == 3 and never.stdout.splitlines() == ["hold:not-selected"], never.stdout
    assert never.stderr.count("\n") == 1 and "run `parcel-hpc select`" in never.stderr
    # The baseline's own code fails past the preflight's step: the rerun job ends in one classified line.
    sel = cli(root, "select", str(search))
    no_traceback(sel)
    assert sel.returncode == 3 and sel.stdout.splitlines()[0] == "hold:invalid-winner", sel.stdout + sel.stderr
    assert "OUTSIDE" not in sel.stdout
    (why,) = [line for line in sel.stdout.splitlines() if "ended without a result" in line]  # one line, on stdout with the evidence
    assert "FailsLate training" in why and "raised KeyError: 'depth'" in why, why
    log = next((search / "selection" / "1" / "logs").glob("rerun-*.out")).read_text()
    assert "Traceback" not in log and log.strip().splitlines()[-1].startswith("error: ")
    held = cli(root, "release", str(search))
    no_traceback(held)
    assert held.returncode == 3 and held.stdout.splitlines() == ["hold:invalid-winner"], held.stdout
    assert held.stderr.count("\n") == 1 and "selection 1 holds" in held.stderr
    assert not (search / "release").exists()


def test_an_edited_baseline_trainer_is_another_search_and_the_selection_trains_the_frozen_copy(root, tmp_path):
    code = tmp_path / "code"  # a private copy (and a cwd without the shared one): editing it changes no other test's trainer
    code.mkdir()
    (code / "width_mlp.py").write_text(USER_TRAINER)
    private = {"PYTHONPATH": str(code)}
    search = root / "runs" / "edited-baseline"
    args = [f"search.root={root / 'runs'}", f"search.revision={search.name}", *SMALL, *WEAK, WEAK_PARAMS]
    res = launch(args, cwd=tmp_path, data_dir=root / "data", env=private)
    assert res.returncode == 0, res.stderr[-2000:]
    with open(code / "width_mlp.py", "a") as f:
        f.write("\n# edited after the launch\n")
    again = launch(args, cwd=tmp_path, data_dir=root / "data", env=private)
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "reject:selection", again.stdout + again.stderr
    # The selection trains the baseline from the search's own copy of its code, never the edited file.
    sel = parcel_hpc(["select", str(search)], cwd=tmp_path, env=private, timeout=600)
    no_traceback(sel)
    assert sel.returncode == 3 and sel.stdout.splitlines()[0] == "hold:slice-quality", sel.stdout + sel.stderr
    assert "baseline timid-approved (trained, width_mlp:Timid)" in sel.stdout and "reject:baseline_trainer" not in sel.stdout


def test_a_released_user_model_serves_from_its_registry_entry_with_the_working_tree_gone(root, tmp_path):
    """The release carries the copy of the user's code that trained it. Python writes bytecode as a
    user's does (PYTHONDONTWRITEBYTECODE unset): an import from a copy neither changes its digest
    nor writes into it."""
    from parcel_hpc.data import load_partition, read_split
    from parcel_hpc.release import load_release

    code = tmp_path / "code"
    code.mkdir()
    (code / "width_mlp.py").write_text(USER_TRAINER)
    private = {"PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": ""}
    search = root / "runs" / "user-released"
    user = ["trainer.target=width_mlp:WidthMLP", "space=width_r1", f"hydra.searchpath=[file://{root / 'my_conf'}]"]
    res = launch(
        [f"search.root={root / 'runs'}", f"search.revision={search.name}", *SMALL, *user, *WEAK, WEAK_PARAMS], cwd=tmp_path, data_dir=root / "data", env=private
    )
    assert res.returncode == 0, res.stderr[-2000:]
    for step in (["select", str(search)], ["decide", str(search), "--accept", "--by", "Dana", "--reason", "test"], ["evaluate-final", str(search)]):
        out = parcel_hpc(step, cwd=tmp_path, env=private, timeout=600)
        no_traceback(out)
    rel = parcel_hpc(["release", str(search)], cwd=tmp_path, env=private, timeout=600)
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    entry = Path(json.loads((search / "release" / "packet.json").read_text())["registry_path"])
    shutil.rmtree(code)  # the working tree gone
    before = sorted(p.relative_to(entry) for p in entry.rglob("*"))
    assert any(p.name == "width_mlp.py" for p in before) and not any("__pycache__" in p.parts for p in before)
    model = load_release(entry, snapshot=root / "data" / "parcels.h5", split=root / "data" / "split-group_r8.json")
    # Imported through the entry load_release holds open (/proc/self/fd/N), which is the entry itself.
    assert type(model).__module__ == "width_mlp" and os.path.realpath(sys.modules["width_mlp"].__file__).startswith(str(entry) + "/")
    frames = load_partition(root / "data" / "parcels.h5", read_split(root / "data" / "split-group_r8.json"), "validation").images[:6]
    scores = model.serve(frames)
    assert scores.shape == (6,) and ((scores >= 0) & (scores <= 1)).all()
    assert sorted(p.relative_to(entry) for p in entry.rglob("*")) == before  # serving wrote nothing
    with pytest.raises(UsageError, match="is not an HDF5 file"):  # one line, not a traceback
        load_release(entry, snapshot=root / "data" / "split-group_r8.json", split=root / "data" / "split-group_r8.json")
