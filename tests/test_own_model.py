"""Your own model, right the first time (issue 27): the trainer's declared parameters are checked
against the space before anything is frozen, a preflight at the space's corners finds a broken
trainer at the door, and the trainer's code is frozen with the contract: workers import the
search's copy, so editing or deleting the working tree cannot touch a running search."""

import shutil
from pathlib import Path

import pytest

from parcel_hpc.ledger import SearchDir
from parcel_hpc.testing import launch, parcel_hpc
from parcel_hpc.testing.runs import finish, start_launch, wait_for
from parcel_hpc.trainer import Param, trainer_identity
from parcel_hpc.trainer.code import snapshot_dir
from parcel_hpc.trainer.params import Kind, check_params, check_space, with_defaults
from parcel_hpc.trainer.preflight import corners

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES_ENV = {"PYTHONPATH": str(ROOT / "examples")}
SGD = "parcel_sgd:SGDTrainer"

BASE = """\
import os, time
from parcel_hpc.trainer import Param
from parcel_hpc.trainer.numpy_mlp import NumpyMLP


class Model(NumpyMLP):
    parameters = {**NumpyMLP.parameters, **EXTRA}

    def build(self, params, seed, data):
        BUILD_CHECK
        super().build(params, seed, data)

    def step(self):
        time.sleep(float(os.environ.get("MY_STEP_S", "0")))
        return super().step()
"""


def write_model(lab: Path, extra: str = "{}", build_check: str = "pass", helpers: str = "MARK = 'original'\n") -> dict[str, str]:
    """A package of the user's own, ``my_models``, outside parcel_hpc; the env that imports it."""
    package = lab / "my_models"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("from my_models.model import Model\n")
    (package / "helpers.py").write_text(helpers)
    (package / "model.py").write_text(BASE.replace("EXTRA", extra).replace("BUILD_CHECK", build_check))
    return {"PYTHONPATH": str(lab)}


def base_args(tmp_path, name, *more):
    return [f"search.root={tmp_path / 'runs'}", f"search.revision={name}", "pruner=none", *more]


# --- declared parameters (pure) -------------------------------------------------------------------


DECLARED = {"lr": Param(float), "width": Param(int), "act": Param(str, default="relu")}


def test_declared_parameters_check_a_space():
    check_space(DECLARED, {"lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True, "step": None}, "width": {"type": "int", "low": 8, "high": 64}}, "M")
    with pytest.raises(Exception, match="searches dropout, which M does not take .* remove dropout"):
        check_space(
            DECLARED,
            {"lr": {"type": "choice", "values": [0.1]}, "width": {"type": "choice", "values": [8]}, "dropout": {"type": "choice", "values": [0.1]}},
            "M",
        )
    with pytest.raises(Exception, match="leaves out width, which M needs"):
        check_space(DECLARED, {"lr": {"type": "choice", "values": [0.1]}}, "M")
    with pytest.raises(Exception, match="width='wide', but M takes width as a int"):
        check_space(DECLARED, {"lr": {"type": "choice", "values": [0.1]}, "width": {"type": "choice", "values": ["wide"]}}, "M")
    with pytest.raises(Exception, match="lr=0.01, but M takes lr as a int"):
        check_space({"lr": Param(int)}, {"lr": {"type": "float", "low": 0.01, "high": 0.5, "log": False, "step": None}}, "M")


def test_declared_parameters_check_fixed_params_and_fill_defaults():
    check_params(DECLARED, {"lr": 0.1, "width": 8}, "M", "selection.baseline.params")
    with pytest.raises(Exception, match="selection.baseline.params names hidden, which M does not take"):
        check_params(DECLARED, {"lr": 0.1, "width": 8, "hidden": 0}, "M", "selection.baseline.params")
    with pytest.raises(Exception, match="leaves out width"):
        check_params(DECLARED, {"lr": 0.1}, "M", "selection.baseline.params")
    assert with_defaults(DECLARED, {"lr": 0.1, "width": 8}) == {"act": "relu", "lr": 0.1, "width": 8}
    assert Kind.FLOAT.accepts(1) and not Kind.INT.accepts(1.5) and not Kind.INT.accepts(True) and Kind.BOOL.accepts(False)
    with pytest.raises(TypeError, match="default 'x'"):
        Param(int, default="x")


def test_corners_are_the_low_and_the_high_end():
    space = {"lr": {"type": "float", "low": 0.01, "high": 0.1}, "hidden": {"type": "choice", "values": [0, 16, 32]}}
    assert corners(space) == [{"lr": 0.01, "hidden": 0}, {"lr": 0.1, "hidden": 32}]
    assert corners({"lr": {"type": "choice", "values": [0.1]}}) == [{"lr": 0.1}]


# --- at the launch: exit 2, one line, nothing written -------------------------------------------------


@pytest.mark.parametrize(
    "extra, build_check, overrides, expected",
    [
        ("{}", "pass", ["dropout=choice(0.1,0.2)"], "the space searches dropout, which Model (my_models:Model) does not take"),
        ("{'width': Param(int)}", "pass", [], "the space leaves out width, which Model (my_models:Model) needs (no default)"),
        ("{}", "pass", ["hidden=choice(small,large)"], "the space gives hidden='small', but Model (my_models:Model) takes hidden as a int"),
        (
            "{}",
            "if params['lr'] > 0.2: raise ValueError(f\"lr={params['lr']} is too large for this model\")",
            [],
            "preflight: my_models:Model fails with the space's high corner {batch_size=128, hidden=64, l2=0.01, lr=0.3}: ValueError: lr=0.3 is too large",
        ),
        ("{}", "params['width']", [], "preflight: my_models:Model fails with the space's low corner"),
    ],
)
def test_a_trainer_that_cannot_run_the_space_is_refused_before_anything_is_written(tmp_path, data_dir, extra, build_check, overrides, expected):
    env = write_model(tmp_path / "lab", extra, build_check)
    for dry in ("false", "true"):
        res = launch(
            base_args(tmp_path, "mine", "trainer.target=my_models:Model", f"search.dry_run={dry}", *overrides), cwd=tmp_path, data_dir=data_dir, env=env
        )
        assert res.returncode == 2, res.stdout + res.stderr
        assert res.stderr.count("\n") == 1 and expected in res.stderr, res.stderr
        assert not (tmp_path / "runs").exists()


def test_a_trainer_that_declares_nothing_is_refused_with_the_declaration_to_write(tmp_path, data_dir):
    env = write_model(tmp_path / "lab")
    model = tmp_path / "lab" / "my_models" / "model.py"
    model.write_text(model.read_text().replace("    parameters = {**NumpyMLP.parameters, **{}}\n", "    parameters = {}\n"))
    res = launch(base_args(tmp_path, "mine", "trainer.target=my_models:Model"), cwd=tmp_path, data_dir=data_dir, env=env)
    assert res.returncode == 2 and "Model declares no parameters" in res.stderr and "Param(float)" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()


def test_check_trainer_takes_the_launchs_space(tmp_path, artifacts):
    bad = parcel_hpc(["check-trainer", SGD, "dropout=choice(0.1,0.2)", "--data", artifacts["dir"]], env=EXAMPLES_ENV)
    assert bad.returncode == 2 and "the space searches dropout, which SGDTrainer" in bad.stderr, bad.stdout + bad.stderr
    ok = parcel_hpc(["check-trainer", SGD, "space=tiny_r1", "--data", artifacts["dir"], "--steps", "3"], env=EXAMPLES_ENV)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "preflight passed at the space's low corner, the space's high corner" in ok.stdout and "serving parity" in ok.stdout


# --- the code snapshot ----------------------------------------------------------------------------


def test_the_trainers_code_is_pinned_with_the_distributions_it_imports(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    identity = trainer_identity(SGD)
    assert identity["code"] == ["parcel_sgd"]
    assert {"numpy", "scikit-learn"} <= set(identity["distributions"])
    assert identity["parameters"] == {"batch_size": "int=64", "hidden": "int=0", "l2": "float=0.0001", "lr": "float, required"}
    builtin = trainer_identity("parcel_hpc.trainer.numpy_mlp:NumpyMLP")
    assert builtin["code"] == [] and "numpy" in builtin["distributions"]  # part of the image: never copied


def test_editing_or_deleting_the_working_tree_cannot_touch_a_running_search(tmp_path, data_dir):
    lab = tmp_path / "lab"
    env = write_model(lab, build_check="from my_models.helpers import MARK\n        assert MARK == 'original', f'the edited working tree ran ({MARK})'")
    env |= {"MY_STEP_S": "0.03"}  # 82 steps: about 2.5 s a trial
    args = base_args(tmp_path, "mine", "trainer.target=my_models:Model", "search.n_trials=4", "hydra.launcher.parallelism=1", "hydra.launcher.pack_size=1")
    proc = start_launch(args, cwd=tmp_path, data_dir=data_dir, env=env)
    search = SearchDir(tmp_path / "runs" / "mine")
    wait_for(
        lambda: (search.path / "contract.json").exists() and search.trial_ids() and search.record("t0000").state.value == "running",
        60,
        "the first trial to run",
    )
    (lab / "my_models" / "helpers.py").write_text("MARK = 'edited'\n")  # every later trial starts after this
    res = finish(proc)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [search.record(t).state.value for t in search.trial_ids()] == ["completed"] * 4
    copy = snapshot_dir(search.path, search.contract()["trainer"]["source_digest"])
    assert (copy / "my_models" / "helpers.py").read_text() == "MARK = 'original'\n"

    again = launch(args[:-2] + ["search.n_trials=5"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert again.returncode == 3 and again.stdout.splitlines()[0] == "reject:trainer", again.stdout + again.stderr

    shutil.rmtree(lab)  # the working tree gone: the search's own copy still serves its reads and selection
    status = parcel_hpc(["status", str(search.path)], cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    sel = parcel_hpc(["select", str(search.path), "--now", "--reason", "working tree deleted"], cwd=tmp_path, env=env)
    # The rerun and the baseline imported the copy: the winner reproduced (an invalid winner would
    # say the rerun could not run); whether it beats the baseline per slice is the gate's business.
    assert sel.stdout.splitlines()[:1] in (["evaluate:final-holdout"], ["hold:performance"], ["hold:slice-quality"]), sel.stdout + sel.stderr


def test_a_local_package_the_trainer_imports_is_copied_only_when_named(tmp_path, data_dir):
    env = write_model(tmp_path / "lab", build_check="import mylab_utils")
    (tmp_path / "lab" / "mylab_utils.py").write_text("SCALE = 1.0\n")
    args = base_args(tmp_path, "mine", "trainer.target=my_models:Model", "search.n_trials=1")
    refused = launch(args, cwd=tmp_path, data_dir=data_dir, env=env)
    assert refused.returncode == 2 and "imports mylab_utils" in refused.stderr and "trainer.code=[mylab_utils]" in refused.stderr, refused.stderr
    assert not (tmp_path / "runs").exists()
    ran = launch([*args, "trainer.code=[mylab_utils]"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    search = SearchDir(tmp_path / "runs" / "mine")
    copy = snapshot_dir(search.path, search.contract()["trainer"]["source_digest"])
    assert (copy / "mylab_utils.py").read_text() == "SCALE = 1.0\n" and (copy / "my_models" / "model.py").is_file()


def test_a_string_parameter_with_markup_is_printed_as_written_through_a_launch(tmp_path, data_dir):
    """A value from the user's space is text, never rich markup: ``[/]`` (a closing tag with nothing
    open) crashed the launch's tables before, and ``[bold]`` would have been swallowed."""
    env = write_model(tmp_path / "lab", extra="{'act': Param(str, default='relu')}", build_check="params['act']")  # read: a parameter never read is refused
    args = base_args(tmp_path, "mine", "trainer.target=my_models:Model", "act=choice('[/]','[bold]x')", "search.n_trials=6")
    dry = launch([*args, "search.dry_run=true"], cwd=tmp_path, data_dir=data_dir, env=env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "act=[/]" in dry.stdout and "act=[bold]x" in dry.stdout, dry.stdout
    ran = launch(args, cwd=tmp_path, data_dir=data_dir, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    search = SearchDir(tmp_path / "runs" / "mine")
    drawn = {search.spec(t).params["act"] for t in search.trial_ids()}
    assert drawn == {"[/]", "[bold]x"}, drawn  # the seed draws both
    best = next(line for line in ran.stdout.splitlines() if "miss-cost=" in line)
    assert "act=[/]" in best or "act=[bold]x" in best, ran.stdout
