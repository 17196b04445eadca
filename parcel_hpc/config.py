"""The typed schema of the composed config, registered in Hydra's ConfigStore as ``parcel_schema``.

Hydra checks every override against it: an unknown option or a wrongly typed value is refused at
composition, before anything is frozen. Hydra's append form (``+search.n_trial=8``) adds a key the
schema lacks all the same; ``unknown_keys`` finds those in the composed config, however they came.
Units are in the field comments.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from parcel_hpc.checkpoints import KEEP_LAST
from parcel_hpc.governance.release_target import DEFAULT_ALIAS, DEFAULT_MODEL_NAME


@dataclass
class SnapshotConf:
    path: str = "data/parcels.h5"  # HDF5 snapshot (schema: docs/snapshot-format.md)
    digest: str | None = None  # sha256:...; null pins the file's content digest at first launch


@dataclass
class SplitConf:
    revision: str = "group_r8"
    path: str = "data/split-group_r8.json"  # split artifact; never the final partition


@dataclass
class PreprocessingConf:
    revision: str = "stats-r1"
    pool: int = 4  # pixels per side averaged into one feature


@dataclass
class MetricConf:
    revision: str = "miss-cost-r3"
    miss_cost: float = 5.0  # cost of one missed damaged parcel
    review_cost: float = 1.0  # cost of one needless manual review


@dataclass
class SpaceConf:
    revision: str = "space-r4"
    params: dict[str, Any] = field(default_factory=dict)  # name -> {type, low/high or values}


@dataclass
class ImageConf:
    kind: str = "computed"  # computed | archive | given
    path: str | None = None  # archive: the image file
    digest: str | None = None  # given: sha256:... container digest


@dataclass
class TrainerConf:
    """The model a search trains: the ``trainer`` group's options (conf/trainer/), or your own class."""

    target: str = MISSING  # PACKAGE.MODULE:NAME of a parcel_hpc.trainer.Trainer, importable where the launch runs
    # More of your packages to copy into the search with the trainer's own (which is always copied):
    # ones it imports from outside its package. Workers import the copies, never the working tree.
    code: list[str] = field(default_factory=list)


@dataclass
class ResourcesConf:
    gpus: int = 1  # GPUs per rank (a trial of one rank: per trial)
    cpus: int = 1  # CPUs per rank
    nodes: int = 1  # nodes one trial spans (governance/shape.py)
    tasks_per_node: int = 1  # ranks of one trial on each node
    shape_by: str | None = None  # a choice parameter of the space whose value picks a trial's shape (None: every trial nodes x tasks_per_node)
    shapes: Any = None  # shape_by's value (a key as the value is written: 8, '8', 0.5) -> {nodes, tasks_per_node}; a value not listed: nodes x tasks_per_node
    mem_gb: Any = 1.0  # memory per trial: GiB, or SLURM's size with a unit (4G, 512M)
    time_limit_min: Any = 10  # wall-clock limit per attempt: minutes, or SLURM's time (2:00:00, 1-00:00:00)
    partition: str | None = None  # SLURM partition (dispatch only, not pinned)
    account: str | None = None  # SLURM account (dispatch only)
    qos: str | None = None  # SLURM QOS (dispatch only)


@dataclass
class BudgetConf:
    """The values live in the ``budget`` group's options (conf/budget/default.yaml), and only there."""

    max_trials: int = MISSING  # trials in the whole search
    gpu_hours_cap: float = MISSING  # accelerator-hours, worst case, all attempts
    cost_cap: float = MISSING  # money, worst case
    rate_per_gpu_hour: float = MISSING  # money per GPU-hour
    rate_per_cpu_hour: float = MISSING  # money per CPU-hour
    max_retries: int = MISSING  # retries per trial after timeouts, node failures, lost jobs, system cancels
    max_preemptions: int = MISSING  # requeues per trial after preemption (not the trial's fault; counted apart)
    systematic_failures: int = MISSING  # trials: the first this many results all failing alike stop the search (0: never)


@dataclass
class CheckpointConf:
    dir: str = "checkpoints"  # root on the shared filesystem
    prefix: str = "{trial_id}"  # per-trial directory under dir; {trial_id} and {<param>} are filled in
    every_steps: int | None = None  # cadence, training steps (or every_s; neither: every_s is the launcher's signal_delay_s)
    every_s: float | None = None  # cadence, seconds of training
    keep_last: int = KEEP_LAST  # checkpoints kept per trial


@dataclass
class PrunerConf:
    kind: str = "asha"  # asha | none
    revision: str = "asha-r1"
    milestones: list[int] = field(default_factory=lambda: [10, 20, 41, 82])  # steps
    reduction_factor: int = 3
    min_peers: int = 4  # peers at a milestone before anyone is pruned


@dataclass
class BaselineConf:
    """The approved model the winner is compared with (conf/selection/baseline/): trained, or released."""

    name: str = MISSING  # the approved model this search's winner is compared with
    trainer: str | None = None  # PACKAGE.MODULE:NAME that trains it like a trial; null: trainer.target
    params: dict[str, Any] = field(default_factory=dict)  # exactly its trainer's parameters (checked against its declaration)
    artifact: str | None = None  # instead of trainer+params: a registry entry of an earlier release, scored as released


@dataclass
class SlicesConf:
    columns: list[str] = field(default_factory=lambda: ["damage_type", "camera_class", "shipment_bucket"])
    shipment_buckets: int = 4  # shipments hashed into this many groups
    min_examples: int = 15  # smaller slices are reported, not gated


@dataclass
class GateConf:
    max_recall_drop: float = 0.05  # per gated slice, against the baseline
    max_miss_cost_rise: float = 0.25  # per gated slice, against the baseline (cost per frame)
    min_recall: dict[str, float] = field(default_factory=dict)  # slice value -> recall the winner must reach


@dataclass
class SelectionConf:
    """How the winner is selected, rerun, gated and released (conf/selection/)."""

    revision: str = MISSING
    rerun_tolerance: float = 0.02  # |rerun - selected| validation miss-cost
    parity_tolerance: float = 1.0e-6  # max |serve(raw) - predict| per validation image
    performance_margin: float = 0.0  # validation miss-cost the winner may have above the baseline's (hold:performance)
    final_performance_margin: float | None = None  # the same on the final partition; None: reported only (hold:final-performance)
    baseline: BaselineConf = field(default_factory=BaselineConf)
    slices: SlicesConf = field(default_factory=SlicesConf)
    gate: GateConf = field(default_factory=GateConf)


@dataclass
class ReleaseConf:
    """Where ``parcel-hpc release`` registers the selected artifact (governance/release_target.py)."""

    registry: str = "folder"  # folder: <search.root>/registry (or release --registry DIR); mlflow: the MLflow Model Registry
    model_name: str = DEFAULT_MODEL_NAME  # mlflow: the registered model each release adds a version to
    alias: str = DEFAULT_ALIAS  # mlflow: moved to each version a release registers; "" moves none
    tracking_uri: str | None = None  # mlflow: the tracking server; null reads MLFLOW_TRACKING_URI when release runs


@dataclass
class SearchConf:
    revision: str = "parcel-search-r1"  # the search lives at <root>/<revision>
    root: str = "runs"  # shared directory
    # Trials the search proposes in all, not this launch: numbers 0..n_trials-1, counting earlier launches'
    # (the same value again resumes the unfinished, proposing nothing new) and duplicates (a proposal
    # whose configuration an earlier trial owns is not run, yet uses its number). <= budget.max_trials.
    n_trials: int = 82
    seed: int = 0  # sampling seed for the space
    dry_run: bool = False  # admit and print, submit nothing
    wait: bool = True  # wait with a progress display until the trials end
    # A root (or a folder above it) its group or others may write without the sticky bit lets them rename
    # a search away and put another in its place: refused unless true (the search's identity checks then defend it).
    allow_renames_in_root: bool = False


@dataclass
class TrainConf:
    steps: int = 82  # training steps per trial
    seed: int = 1234  # initialisation and batching seed, shared by every trial
    step_seconds: float = 0.0  # minimum wall time per step: emulates a heavier model (demos, fault tests)
    # A positive space parameter that scales step_seconds (a step sleeps step_seconds x its value):
    # trials of unequal length for tests and benchmarks. Left out of the contract while unset.
    step_seconds_param: str | None = None
    # Where exact resume is impossible (a library RNG without a getter, nondeterministic GPU kernels):
    # the largest difference the launch's resume check accepts; a resumed trial's metric is then
    # marked as such. Left out of the contract while unset (exact resume required).
    resume_tolerance: float | None = None


@dataclass
class ParcelConf:
    snapshot: SnapshotConf = field(default_factory=SnapshotConf)
    split: SplitConf = field(default_factory=SplitConf)
    preprocessing: PreprocessingConf = field(default_factory=PreprocessingConf)
    metric: MetricConf = field(default_factory=MetricConf)
    space: SpaceConf = field(default_factory=SpaceConf)
    sampler: dict[str, Any] = field(default_factory=lambda: {"name": "random"})  # conf/sampler/: name and options (propose.samplers)
    image: ImageConf = field(default_factory=ImageConf)
    trainer: TrainerConf = field(default_factory=TrainerConf)
    resources: ResourcesConf = field(default_factory=ResourcesConf)
    budget: BudgetConf = field(default_factory=BudgetConf)
    checkpoint: CheckpointConf = field(default_factory=CheckpointConf)
    pruner: PrunerConf = field(default_factory=PrunerConf)
    selection: SelectionConf = field(default_factory=SelectionConf)
    release: ReleaseConf = field(default_factory=ReleaseConf)
    search: SearchConf = field(default_factory=SearchConf)
    train: TrainConf = field(default_factory=TrainConf)


@dataclass
class ParcelSweeperConf:
    """``hydra/sweeper=parcel``: the only sweeper a search runs (hydra_plugins/parcel_hpc_plugins registers it)."""

    _target_: str = "hydra_plugins.parcel_hpc_plugins.sweeper.ParcelSweeper"
    # Parameter -> Hydra sweep grammar (``tag(log, interval(0.003, 0.3))``), as Hydra 1.2+ sweepers take it.
    params: dict[str, str] = field(default_factory=dict)


def unknown_keys(values: Mapping[str, Any], schema: type, where: str = "") -> list[tuple[str, str]]:
    """Each key of ``values`` that ``schema`` (a dataclass of this module) does not know, dotted from
    ``where``, with the nearest key it knows at that place ("" when none is near); pure. A field the
    schema leaves open (a dict, Any) is not looked into: what it holds is checked where it is read."""
    hints = typing.get_type_hints(schema)
    known = [f.name for f in dataclasses.fields(schema)]
    out: list[tuple[str, str]] = []
    for key, value in values.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in hints:
            near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            out.append((dotted, f"{where}.{near[0]}" if near and where else near[0] if near else ""))
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, Mapping):
            out += unknown_keys(value, hints[key], dotted)
    return out


def register() -> None:
    store = ConfigStore.instance()
    store.store(name="parcel_schema", node=ParcelConf)


register()


# The config groups: conf/ at the top of the repository, installed as the package parcel_hpc.conf.
CONF_DIR = Path(str(resources.files("parcel_hpc.conf")))


def configured_search_root() -> Path:
    """``search.root`` as the launch composes it (``conf/``, ``PARCEL_SEARCH_ROOT``): where
    ``parcel-hpc list`` looks when it is given no root."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config")
    return Path(str(cfg.search.root))
