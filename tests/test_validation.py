"""Validation at the door: every text that can reach a path, a job name, a batch-script line, a
scheduler argument or a shell is refused at composition, one line naming the key and the rule,
exit 2, nothing written. SLURM's own units for memory and time are accepted."""

import copy
import json
import re
from pathlib import Path

import h5py
import pytest
from hydra import compose, initialize_config_module
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from parcel_hpc.config import CONF_DIR as CONF
from parcel_hpc.config import ParcelConf, unknown_keys
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.scheduler.factory import executor_kind
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.scheduler.slurm.launcher import SubmititSlurmConf
from parcel_hpc.testing import launch, parcel_hpc

DOCS = Path(__file__).resolve().parents[1] / "docs"

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


def checked(cfg, launcher):
    """``validation.checked`` with the launcher's backend's own checks, as a launch calls it."""
    return validation.checked(cfg, launcher, backend_of(executor_kind(launcher.get("kind"))).check_launcher)


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
        checked(cfg, launcher)
    message = str(info.value)
    assert "\n" not in message and "; " in message
    return message


def test_the_default_config_passes_and_units_become_the_contracts():
    cfg, launcher = checked(with_value("resources.mem_gb", "512M"), SLURM)
    assert cfg["resources"]["mem_gb"] == 0.5 and isinstance(cfg["resources"]["time_limit_min"], int)
    assert launcher == SLURM
    assert CFG["resources"]["mem_gb"] == 1.0  # the caller's config is not changed


@pytest.mark.parametrize("value", [-1, 1001, 2.5, True, "3"])
def test_systematic_failures_is_a_whole_number_of_trials_or_zero_for_never(value):
    message = refusal(with_value("budget.systematic_failures", value))
    assert message.startswith("budget.systematic_failures=") and "0..1000" in message
    for fine in (0, 1, 3):
        checked(with_value("budget.systematic_failures", fine), SLURM)


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
        ("additional_parameters", {"contiguous": False}, "is false"),
    ],
)
def test_bad_slurm_launcher_values_are_refused(key, value, rule):
    message = refusal(launcher={**SLURM, key: value})
    assert message.startswith(f"hydra.launcher.{key}") and rule in message


def test_setup_lines_are_shell_and_extra_options_are_passed():
    extra = {"constraint": "a100|h100&ib", "contiguous": True, "nice": 10, "nodelist": "n[1-3]"}
    launcher = {**SLURM, "setup": ["module load cuda/12 && source $HOME/venv/bin/activate"], "additional_parameters": extra}
    assert checked(CFG, launcher)[1] == launcher
    assert checked(with_value("resources.partition", "gpu,gpu-low"), SLURM)[0]["resources"]["partition"] == "gpu,gpu-low"
    long_revision = with_value("search.revision", "r" * 64)
    assert checked(long_revision, {**SLURM, "job_name": "parcel-" + "r" * 64})  # the default job name of the longest revision


def test_a_choice_value_that_names_a_checkpoint_directory_must_be_a_name():
    cfg = with_value("space.params", {"act": {"type": "choice", "values": ["relu", "../../etc"]}})
    cfg = with_value("checkpoint.prefix", "{trial_id}/{act}", cfg)
    assert refusal(cfg).startswith("space.params.act.values='../../etc' is not a safe name")
    assert checked(with_value("checkpoint.prefix", "{trial_id}", cfg), SLURM)  # not in the prefix: any text


# --- numbers: every one has a range ------------------------------------------------------------


def _every_option() -> list[list[str]]:
    """The default composition, and one with each option of each config group (and the SLURM launcher)."""
    options = [[f"{p.parent.relative_to(CONF).as_posix()}={p.stem}"] for p in sorted(CONF.rglob("*.yaml")) if p.parent != CONF]
    return [[], ["hydra/launcher=submitit_slurm"], *options]


def _composed(overrides: list[str]) -> dict:
    with initialize_config_module("parcel_hpc.conf", version_base="1.3"):
        config = compose("config", overrides=overrides, return_hydra_config=True)
    launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
    job = OmegaConf.to_container(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]), resolve=True)
    return {**job, "hydra": {"launcher": launcher}}


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), node


COMPOSED_ONCE = pytest.mark.xdist_group("validation-composed")  # its users on one worker: the options composed once


@pytest.fixture(scope="module")
def composed() -> list[dict]:
    """Every option composed, once, by the worker that runs these tests (not by every one that collects them)."""
    return [_composed(o) for o in _every_option()]


@COMPOSED_ONCE
def test_every_number_of_every_group_option_has_a_range(composed):
    """A numeric key added to conf/ or config.py without a range in validation.NUMBERS fails here."""
    unranged = set()
    for cfg in composed:
        for key, _ in validation.numbers(cfg):
            if validation.rule_for(key) is None and key not in validation.UNITS and not key.startswith(validation.PARAMETERS):
                unranged.add(key)
    assert not unranged, f"numeric keys with no range in validation.NUMBERS: {sorted(unranged)}"
    assert len(composed) > 25 and any(k == "sampler.n_ei_candidates" for cfg in composed for k, _ in validation.numbers(cfg))


@COMPOSED_ONCE
def test_every_range_names_a_key_some_option_has(composed):
    present = {key for cfg in composed for key, _ in _leaves(cfg)}
    parents = {key.rpartition(".")[0] for key in present}
    stale = [k for k in validation.NUMBERS if k.replace("[]", "") not in present and not (k.endswith(".*") and k[:-2] in parents)]
    assert not stale, stale


@COMPOSED_ONCE
def test_every_group_option_passes_its_own_ranges(composed):
    for cfg in composed:
        if "???" not in str(cfg):  # an option that needs a value given (image=archive's path)
            validation._check_numbers(cfg, cfg["hydra"]["launcher"])


@pytest.mark.parametrize(
    ("key", "value", "range_"),
    [
        ("train.steps", -3, "in 1..100000000"),
        ("train.steps", 2.5, "not a whole number"),
        ("checkpoint.every_steps", 0, "in 1..100000000"),
        ("checkpoint.keep_last", 0, "in 1..1000"),
        ("preprocessing.pool", 0, "in 1..1024"),
        ("metric.miss_cost", -5.0, "> 0 and <= 1e+12"),
        ("metric.review_cost", 0.0, "> 0"),
        ("metric.miss_cost", float("nan"), "not a number"),
        ("train.step_seconds", float("inf"), "in 0..3600"),
        ("resources.gpus", -1, "in 0..64"),
        ("resources.cpus", 0, "in 1..4096"),
        ("budget.max_trials", 0, "in 1..1000000"),
        ("budget.cost_cap", -1.0, "in 0..1e+12"),
        ("budget.max_retries", True, "not a whole number"),
        ("budget.systematic_failures", 1001, "in 0..1000"),
        ("pruner.reduction_factor", 1, "in 2..1000"),
        ("pruner.min_peers", 0, "in 1..1000000"),
        ("search.n_trials", -1, "in 0..1000000"),
        ("search.seed", 2**32, "in 0..4294967295"),
        ("selection.gate.max_recall_drop", 1.5, "in 0..1"),
        ("selection.gate.min_recall.crushed_corner", 2.0, "in 0..1"),
        ("selection.parity_tolerance", -1e-6, "in 0..1"),
        ("selection.slices.shipment_buckets", 0, "in 1..1000000"),
        ("sampler.n_ei_candidates", 0, "in 1..1000000"),
        ("sampler.sigma0", 0.0, "> 0 and <= 1e+12, or null"),
    ],
)
def test_a_number_out_of_its_range_is_refused_naming_the_key_the_value_and_the_range(key, value, range_):
    cfg = _composed([])
    node = cfg
    *parents, last = key.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    message = refusal(cfg, cfg.pop("hydra")["launcher"])
    assert message.startswith(f"{key}={value!r} is ") and "; give " in message and range_ in message, message


@pytest.mark.parametrize(("key", "value"), [("parallelism", 0), ("signal_delay_s", 0), ("pack_minutes", 0), ("array_parallelism", -1)])
def test_launcher_numbers_are_ranged(key, value):
    launcher = {"kind": "local", "parallelism": 2, "signal_delay_s": 30, "pack_size": "auto", "pack_minutes": None, **{key: value}}
    assert refusal(launcher=launcher).startswith(f"hydra.launcher.{key}={value!r} is out of range; give ")


@pytest.mark.parametrize(
    ("milestones", "kind", "steps", "rule"),
    [
        ([20, 10, 41, 82], "asha", 82, "not strictly increasing"),
        ([10, 10], "none", 82, "not strictly increasing"),
        ([10, 20, 41, 82], "asha", 40, "goes past train.steps=40"),
        ([], "asha", 82, "is empty: no trial could report a milestone"),  # the worker's store refuses none: every trial would fail
        ([], "none", 82, "is empty: no trial could report a milestone"),
    ],
)
def test_milestones_increase_and_an_asha_rule_stays_within_the_steps(milestones, kind, steps, rule):
    cfg = {**with_value("pruner", {"kind": kind, "revision": "p", "milestones": milestones}), "train": {"steps": steps}}
    assert refusal(cfg).startswith("pruner.milestones=") and rule in refusal(cfg)
    checked({**cfg, "pruner": {"kind": "none", "revision": "p", "milestones": [10, 20, 41, 82]}}, SLURM)  # pruner=none only scores there


def test_a_key_no_schema_knows_is_named_with_the_nearest_one():
    """However it came in (Hydra's ``+key=value`` appends one the schema lacks); a field the schema
    leaves open (the sampler's options, a baseline's params) is checked where it is read."""
    assert unknown_keys(CFG, ParcelConf) == []
    assert unknown_keys(with_value("search.n_trial", 8), ParcelConf) == [("search.n_trial", "search.n_trials")]
    assert unknown_keys(with_value("selection.baseline.nmae", "x"), ParcelConf) == [("selection.baseline.nmae", "selection.baseline.name")]
    assert unknown_keys({**CFG, "seach": {}}, ParcelConf) == [("seach", "search")]
    assert unknown_keys({**CFG, "sampler": {"name": "tpe", "anything": 1}}, ParcelConf) == []
    assert unknown_keys({**SLURM, "paralelism": 3}, SubmititSlurmConf, "hydra.launcher") == [("hydra.launcher.paralelism", "hydra.launcher.array_parallelism")]


# --- refused sbatch spellings: what the docs say is what validation does ------------------------


def _documented_refusals() -> list[str]:
    """The options docs/slurm-and-accounting.md says are refused: the ones parcel_hpc sets itself
    and the resources in another spelling (each backticked name in that parenthesis)."""
    text = " ".join((DOCS / "slurm-and-accounting.md").read_text().split())
    own = re.search(r"never an option parcel_hpc sets itself \(([^)]*)\)", text)
    spellings = re.search(r"a resource in another spelling \(([^)]*)\)", text)
    assert own and spellings, "the docs' list of refused sbatch options moved; point this test at it"
    named = [w.strip().replace(" ", "-") for w in own.group(1).split(",")]
    return named + re.findall(r"`([a-z-]+)`", spellings.group(1))


@pytest.mark.parametrize("option", sorted({*_documented_refusals(), "tres-per-task", "exclusive", "mincpus"}))
def test_every_documented_refused_sbatch_option_is_refused(option):
    for spelled in (option, option.replace("-", "_")):
        for value in ("gres/gpu:4", True, 4):
            message = refusal(launcher={**SLURM, "additional_parameters": {spelled: value}})
            assert message.startswith(f"hydra.launcher.additional_parameters.{spelled}=") and "set by parcel_hpc itself" in message


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


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.steps=-3"], "train.steps=-3 is out of range; give a whole number in 1..100000000"),
        (["checkpoint.every_steps=0"], "checkpoint.every_steps=0 is out of range"),
        (["checkpoint.every_steps=10", "checkpoint.every_s=20"], "checkpoint.every_s=20.0 is given with checkpoint.every_steps=10; give one cadence"),
        (["checkpoint.keep_last=0"], "checkpoint.keep_last=0 is out of range"),
        (["preprocessing.pool=0"], "preprocessing.pool=0 is out of range"),
        (["metric.miss_cost=-5"], "metric.miss_cost=-5.0 is out of range; give a number > 0 and <= 1e+12"),
        (["pruner.milestones=[20,10,41,82]"], "pruner.milestones=[20, 10, 41, 82] is not strictly increasing"),
        (["hydra/launcher=submitit_slurm", "+hydra.launcher.additional_parameters.tres_per_task=gres/gpu:8"], "set by parcel_hpc itself"),
    ],
)
def test_bad_numbers_through_the_launch_write_nothing(tmp_path, data_dir, overrides, needle):
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
