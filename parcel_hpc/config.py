"""The typed schema of the composed config, registered in Hydra's ConfigStore as ``parcel_schema``.

Hydra checks every override against it: an unknown option or a wrongly typed value is refused at
composition, before anything is frozen. Units are in the field comments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class SnapshotConf:
    path: str = "data/parcels.h5"  # HDF5 snapshot (schema in README)
    digest: Optional[str] = None  # sha256:...; null pins the file's content digest at first launch


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
    params: Dict[str, Any] = field(default_factory=dict)  # name -> {type, low/high or values}


@dataclass
class ImageConf:
    kind: str = "computed"  # computed | archive | given
    path: Optional[str] = None  # archive: the image file
    digest: Optional[str] = None  # given: sha256:... container digest


@dataclass
class ResourcesConf:
    gpus: int = 1  # GPUs per trial
    cpus: int = 1  # CPUs per trial
    mem_gb: float = 1.0  # memory per trial, GiB
    time_limit_min: int = 10  # wall-clock limit per attempt, minutes
    partition: Optional[str] = None  # SLURM partition (dispatch only, not pinned)
    account: Optional[str] = None  # SLURM account (dispatch only)
    qos: Optional[str] = None  # SLURM QOS (dispatch only)


@dataclass
class BudgetConf:
    max_trials: int = 82  # trials in the whole search
    gpu_hours_cap: float = 200.0  # accelerator-hours, worst case, all attempts
    cost_cap: float = 500.0  # money, worst case
    rate_per_gpu_hour: float = 2.0  # money per GPU-hour
    rate_per_cpu_hour: float = 0.05  # money per CPU-hour
    max_retries: int = 2  # retries per trial after timeouts, node failures, lost jobs, system cancels
    max_preemptions: int = 10  # requeues per trial after preemption (not the trial's fault; counted apart)


@dataclass
class CheckpointConf:
    dir: str = "checkpoints"  # root on the shared filesystem
    prefix: str = "{trial_id}"  # per-trial directory under dir; {trial_id} and {<param>} are filled in
    every_steps: int = 10  # cadence, training steps
    keep_last: int = 2  # checkpoints kept per trial


@dataclass
class PrunerConf:
    kind: str = "asha"  # asha | none
    revision: str = "asha-r1"
    milestones: List[int] = field(default_factory=lambda: [10, 20, 41, 82])  # steps
    reduction_factor: int = 3
    min_peers: int = 4  # peers at a milestone before anyone is pruned


@dataclass
class SearchConf:
    revision: str = "parcel-search-r1"  # the search lives at <root>/<revision>
    root: str = "runs"  # shared directory
    n_trials: int = 82  # trials this launch proposes
    seed: int = 0  # sampling seed for the space
    dry_run: bool = False  # admit and print, submit nothing
    wait: bool = True  # wait with a progress display until the trials end


@dataclass
class TrainConf:
    steps: int = 82  # training steps per trial
    seed: int = 1234  # initialisation and batching seed, shared by every trial
    step_seconds: float = 0.0  # minimum wall time per step: emulates a heavier model (demos, fault tests)


@dataclass
class ParcelConf:
    snapshot: SnapshotConf = field(default_factory=SnapshotConf)
    split: SplitConf = field(default_factory=SplitConf)
    preprocessing: PreprocessingConf = field(default_factory=PreprocessingConf)
    metric: MetricConf = field(default_factory=MetricConf)
    space: SpaceConf = field(default_factory=SpaceConf)
    image: ImageConf = field(default_factory=ImageConf)
    resources: ResourcesConf = field(default_factory=ResourcesConf)
    budget: BudgetConf = field(default_factory=BudgetConf)
    checkpoint: CheckpointConf = field(default_factory=CheckpointConf)
    pruner: PrunerConf = field(default_factory=PrunerConf)
    search: SearchConf = field(default_factory=SearchConf)
    train: TrainConf = field(default_factory=TrainConf)


def register() -> None:
    ConfigStore.instance().store(name="parcel_schema", node=ParcelConf)


register()
