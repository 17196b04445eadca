"""Validation at the door: every text that can reach a path, a job name, a batch-script line, a
scheduler argument or a shell is refused at composition, one line naming the key and the rule,
exit 2, nothing written. SLURM's own units for memory and time are accepted."""

import copy
import json

import h5py
import pytest
from hypothesis import given
from hypothesis import strategies as st

from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.testing import launch, parcel_hpc

# A composed job config and launcher group, as the sweeper gets them (only what validation reads).
CFG = {
    "search": {"revision": "parcel-search-r1", "root": "runs"},
    "split": {"revision": "group_r8", "path": "data/split-group_r8.json"},
    "snapshot": {"path": "data/parcels.h5", "digest": None},
    "preprocessing": {"revision": "stats-r1", "pool": 4},
    "metric": {"revision": "miss-cost-r3"},
    "space": {"revision": "space-r4", "params": {"lr": {"type": "loguniform", "low": 0.01, "high": 0.1}, "hidden": {"type": "choice", "values": [0, 16]}}},
    "pruner": {"revision": "asha-r1"},
    "selection": {"revision": "gate-r1", "baseline": {"name": "logreg-approved", "params": {}}, "gate": {"min_recall": {"crushed_corner": 0.75}}},
    "image": {"kind": "computed", "path": None},
    "trainer": {"target": "parcel_hpc.trainer.numpy_mlp:NumpyMLP"},
    "checkpoint": {"dir": "runs/parcel-search-r1/checkpoints", "prefix": "{trial_id}"},
    "resources": {"gpus": 1, "cpus": 1, "mem_gb": 1.0, "time_limit_min": 10, "partition": None, "account": None, "qos": None},
    "budget": {"systematic_failures": 3},
}
SLURM = {"kind": "slurm", "job_name": "parcel-parcel-search-r1", "array_parallelism": 16, "signal_delay_s": 60, "setup": [], "additional_parameters": {}}


def with_value(dotted: str, value, base=CFG):
    cfg = copy.deepcopy(base)
    node = cfg
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return cfg


def refusal(cfg=CFG, launcher=SLURM) -> str:
    with pytest.raises(UsageError) as info:
        validation.checked(cfg, launcher)
    message = str(info.value)
    assert "\n" not in message and "; " in message
    return message


def test_the_default_config_passes_and_units_become_the_contracts():
    cfg, launcher = validation.checked(with_value("resources.mem_gb", "512M"), SLURM)
    assert cfg["resources"]["mem_gb"] == 0.5 and isinstance(cfg["resources"]["time_limit_min"], int)
    assert launcher == SLURM
    assert CFG["resources"]["mem_gb"] == 1.0  # the caller's config is not changed


@pytest.mark.parametrize("value", [-1, 1001, 2.5, True, "3"])
def test_systematic_failures_is_a_whole_number_of_trials_or_zero_for_never(value):
    message = refusal(with_value("budget.systematic_failures", value))
    assert message.startswith("budget.systematic_failures=") and "0..1000" in message
    for fine in (0, 1, 3):
        validation.checked(with_value("budget.systematic_failures", fine), SLURM)


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("search.revision", "a/b", "not a safe name"),
        ("search.revision", "..", "not a safe name"),
        ("search.revision", "r1..r2", "not a safe name"),
        ("search.revision", "r1\nr2", "control or line-break"),
        ("search.revision", "r1;rm -rf ~", "not a safe name"),
        ("search.revision", "r1$(id)", "not a safe name"),
        ("search.revision", "x" * 65, "characters long"),
        ("split.revision", "group r8", "not a safe name"),
        ("metric.revision", "m\tr3", "control or line-break"),
        ("selection.baseline.name", "../approved", "not a safe name"),
        ("resources.partition", "low\n#SBATCH --uid=0", "control or line-break"),
        ("resources.partition", "low --account=root", "not a partition or a list of them"),
        ("resources.partition", "low,", "not a partition or a list of them"),
        ("resources.account", "a`id`", "not a safe name"),
        ("resources.qos", "high;id", "not a safe name"),
        ("search.root", "/tmp/a b", "whitespace or a shell character"),
        ("search.root", "/tmp/$HOME", "whitespace or a shell character"),
        ("snapshot.path", "data/p\x00.h5", "control or line-break"),
        ("checkpoint.dir", "/ck|tee", "whitespace or a shell character"),
        ("checkpoint.prefix", "../{trial_id}", "leaves the checkpoint directory"),
        ("checkpoint.prefix", "/abs/{trial_id}", "leaves the checkpoint directory"),
        ("checkpoint.prefix", "{trial_id}/{nope}", "neither trial_id nor a space parameter"),
        ("checkpoint.prefix", "{trial_id", "not a template"),
        ("trainer.target", "os.system", "not an import target"),
        ("trainer.target", "m:f;id", "not an import target"),
        ("resources.mem_gb", "4GB", "not a memory size"),
        ("resources.mem_gb", "4096", "not a memory size"),
        ("resources.mem_gb", 0.0001, "out of range"),
        ("resources.mem_gb", True, "bool"),
        ("resources.time_limit_min", "2h", "not a time limit"),
        ("resources.time_limit_min", 0, "out of range"),
        ("resources.time_limit_min", 1.5, "float"),
        ("space.revision", "s\u2028r4", "control or line-break"),
        ("selection.revision", "gate#SBATCH", "#SBATCH"),
    ],
)
def test_bad_values_are_refused_naming_the_key_and_the_rule(key, value, rule):
    message = refusal(with_value(key, value))
    assert message.startswith(f"{key}=") and rule in message


def test_any_text_anywhere_with_a_control_character_is_refused():
    cfg = with_value("space.params", {"act": {"type": "choice", "values": ["relu", "tanh\r"]}})
    assert refusal(cfg).startswith("space.params.act.values[1]=")
    assert "space.params.a b" in refusal(with_value("space.params", {"a b": {"type": "choice", "values": [1]}}))


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("job_name", "parcel/x", "not a safe name"),
        ("job_name", "x" * 81, "characters long"),
        ("additional_parameters", {"ntasks": 4}, "set by parcel_hpc itself"),
        ("additional_parameters", {"mem_per_gpu": "8G"}, "set by parcel_hpc itself"),
        ("setup", ["module load cuda\n#SBATCH --uid=0"], "control or line-break"),
        ("setup", ["echo '#SBATCH --uid=0'"], "#SBATCH"),
        ("additional_parameters", {"constraint": "a100 --uid=0"}, "not safe in an #SBATCH line"),
        ("additional_parameters", {"constraint": "a100\n"}, "control or line-break"),
        ("additional_parameters", {"uid=0 --x": "1"}, "not an sbatch option name"),
        ("additional_parameters", {"comment": "mine"}, "set by parcel_hpc itself"),
        ("additional_parameters", {"job-name": "other"}, "set by parcel_hpc itself"),
        ("additional_parameters", {"wckey": "other"}, "set by parcel_hpc itself"),
        ("additional_parameters", {"exclusive": False}, "is false"),
    ],
)
def test_bad_slurm_launcher_values_are_refused(key, value, rule):
    message = refusal(launcher={**SLURM, key: value})
    assert message.startswith(f"hydra.launcher.{key}") and rule in message


def test_setup_lines_are_shell_and_extra_options_are_passed():
    extra = {"constraint": "a100|h100&ib", "exclusive": True, "nice": 10, "nodelist": "n[1-3]"}
    launcher = {**SLURM, "setup": ["module load cuda/12 && source $HOME/venv/bin/activate"], "additional_parameters": extra}
    assert validation.checked(CFG, launcher)[1] == launcher
    assert validation.checked(with_value("resources.partition", "gpu,gpu-low"), SLURM)[0]["resources"]["partition"] == "gpu,gpu-low"
    long_revision = with_value("search.revision", "r" * 64)
    assert validation.checked(long_revision, {**SLURM, "job_name": "parcel-" + "r" * 64})  # the default job name of the longest revision


def test_a_choice_value_that_names_a_checkpoint_directory_must_be_a_name():
    cfg = with_value("space.params", {"act": {"type": "choice", "values": ["relu", "../../etc"]}})
    cfg = with_value("checkpoint.prefix", "{trial_id}/{act}", cfg)
    assert refusal(cfg).startswith("space.params.act.values='../../etc' is not a safe name")
    assert validation.checked(with_value("checkpoint.prefix", "{trial_id}", cfg), SLURM)  # not in the prefix: any text


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("90", 90), ("2:00:00", 120), ("1:30", 2), ("10:00", 10), ("1-00:00:00", 1440), ("1-2", 1560), ("1-02:30", 1590), ("0:00:30", 1), (45, 45)],
)
def test_slurm_time_limits(text, minutes):
    assert validation.time_min("resources.time_limit_min", text) == minutes


@pytest.mark.parametrize(("text", "gb"), [("4G", 4.0), ("512M", 0.5), ("100M", 100 / 1024), ("1T", 1024.0), ("2g", 2.0), (8, 8.0), (0.25, 0.25)])
def test_slurm_memory_sizes(text, gb):
    assert validation.mem_gb("resources.mem_gb", text) == pytest.approx(gb)


@given(st.text(min_size=1, max_size=80))
def test_a_name_that_passes_is_safe_everywhere_a_name_goes(text):
    try:
        name = validation.name("k", text)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert "/" not in name and ".." not in name and not name.startswith((".", "-"))
    assert all(ch.isascii() and (ch.isalnum() or ch in "._-") for ch in name)


# --- through the real launch: one line, exit 2, nothing written ---------------------------------


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["search.revision='r1\nr2'"], "search.revision="),
        (["search.revision=a..b"], "search.revision='a..b' is not a safe name"),
        (["search.revision='a/b'"], "search.revision='a/b' is not a safe name"),
        (["resources.partition='low\n#SBATCH --uid=0'"], "resources.partition="),
        (["resources.qos='high;id'"], "resources.qos='high;id' is not a safe name"),
        (["resources.mem_gb=4GB"], "is not a memory size"),
        (["checkpoint.prefix='{trial_id}/{nope}'"], "neither trial_id nor a space parameter"),
        (["hydra/launcher=submitit_slurm", "+hydra.launcher.additional_parameters.comment=mine"], "set by parcel_hpc itself"),
    ],
)
def test_bad_input_through_the_launch_writes_nothing(tmp_path, data_dir, overrides, needle):
    res = launch([f"search.root={tmp_path / 'runs'}", *overrides], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_search_root_from_the_environment_with_a_newline_is_refused(tmp_path, data_dir):
    res = launch([], cwd=tmp_path, data_dir=data_dir, env={"PARCEL_SEARCH_ROOT": str(tmp_path / "runs\nx")})
    assert res.returncode == 2 and "search.root=" in res.stderr and "control or line-break" in res.stderr, res.stderr
    assert [p.name for p in tmp_path.iterdir()] == [data_dir.name]  # the fixture's snapshot only


def test_slurm_units_launch_and_are_pinned_as_numbers(tmp_path, data_dir):
    res = launch(
        [f"search.root={tmp_path / 'runs'}", "search.n_trials=1", "resources.mem_gb=512M", "resources.time_limit_min=0:20:00", "search.dry_run=true"],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    assert res.returncode == 0, res.stderr
    assert "x 0.33 h limit" in res.stdout and "worst case: 1.00 GPU-hours" in res.stdout  # 1 trial x 3 attempts x 20 min


def test_a_snapshot_with_a_wrong_schema_is_refused_at_the_launch(tmp_path, data_dir):
    with h5py.File(data_dir / "parcels.h5", "r+") as f:
        del f["camera_class"]
    res = launch([f"search.root={tmp_path / 'runs'}"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 2 and "missing dataset 'camera_class'" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_contract_edited_by_hand_is_refused_by_launch_and_status(tmp_path, data_dir):
    overrides = [f"search.root={tmp_path / 'runs'}", "search.n_trials=1", "pruner=none"]
    assert launch(overrides, cwd=tmp_path, data_dir=data_dir).returncode == 0
    path = tmp_path / "runs" / "parcel-search-r1" / "contract.json"
    obj = json.loads(path.read_text())
    obj["contract"]["metric"]["miss_cost"] = 1.0  # a cheaper miss, after the fact
    path.write_text(json.dumps(obj))
    before = sorted((str(p), p.stat().st_mtime_ns) for p in path.parent.rglob("*"))
    for res in (launch(overrides, cwd=tmp_path, data_dir=data_dir), parcel_hpc(["status", str(path.parent)])):
        assert res.returncode == 2 and "contract file was edited" in res.stderr and len(res.stderr.splitlines()) == 1, res.stderr
    assert sorted((str(p), p.stat().st_mtime_ns) for p in path.parent.rglob("*")) == before
