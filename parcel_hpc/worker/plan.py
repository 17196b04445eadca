"""What a worker is told to run: a small, picklable plan built by the launch (propose.specs) from the frozen contract.

The worker trusts nothing in it blindly: digests are recomputed from the files it opens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from parcel_hpc import anchor
from parcel_hpc.checkpoints import KEEP_LAST
from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import SearchDir, TrialSpec
from parcel_hpc.lifecycle.actions import RetryPolicy

TRIAL_FIELDS = ("trial_id", "config_hash", "params", "seed", "image_digest", "nodes", "tasks_per_node")


def trial_fields(spec: TrialSpec) -> dict[str, Any]:
    shape = spec.shape  # its own: trials of one search may differ in shape (governance/shape.ShapePlan)
    return {
        "trial_id": spec.trial_id,
        "config_hash": spec.config_hash,
        "params": dict(spec.params),
        "seed": spec.seed,
        "image_digest": spec.image_digest,
        "nodes": shape.nodes,
        "tasks_per_node": shape.tasks_per_node,
    }


@dataclass(frozen=True)
class WorkerPlan:
    search_dir: str
    trial_id: str
    config_hash: str
    contract_digest: str
    params: Mapping[str, Any]
    seed: int
    snapshot_path: str
    split_path: str
    image: Mapping[str, Any]
    image_digest: str
    steps: int
    metric: Mapping[str, Any]
    preprocessing: Mapping[str, Any]
    pruner: Mapping[str, Any]
    checkpoint_root: str
    max_retries: int
    max_preemptions: int
    checkpoint_prefix: str = "{trial_id}"
    every_steps: int | None = 10  # a plan written before every_s: its cadence was 10 steps
    every_s: float | None = None
    keep_last: int = KEEP_LAST
    step_seconds: float = 0.0
    step_seconds_param: str = ""  # a space parameter scaling step_seconds ("" : none)
    gpus: int = 0
    cpus: int = 1
    time_limit_min: int = 10
    rank_wait_s: float = 60.0  # a gang: how long its ranks wait on one another at a step boundary (the launcher's signal_delay_s)
    nodes: int = 1  # the trial's own shape: the job it runs in is this many nodes x tasks_per_node ranks
    tasks_per_node: int = 1

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> WorkerPlan:
        return cls(**obj)

    @classmethod
    def for_trial(cls, template: Mapping[str, Any], spec: TrialSpec) -> WorkerPlan:
        """The plan of ``spec`` from a launch's ``template`` (every field but the trial's own)."""
        return cls(**{**template, **trial_fields(spec)})

    def template(self) -> dict:
        """This plan without the trial's own fields: what every trial of its launch shares."""
        return {k: v for k, v in self.to_json().items() if k not in TRIAL_FIELDS}

    @classmethod
    def load(cls, search: SearchDir, trial_id: str) -> WorkerPlan:
        obj = search.plan_json(trial_id)
        if "nodes" not in obj:  # written before shapes per trial: its spec's (a gang's plan said nothing of its ranks)
            shape = search.spec(trial_id).shape
            obj = {**obj, "nodes": shape.nodes, "tasks_per_node": shape.tasks_per_node}
        return cls.from_json(obj)

    @property
    def shape(self) -> TrialShape:
        """The shape of the job this trial runs in (a pack's trials share one)."""
        return TrialShape(self.nodes, self.tasks_per_node, self.gpus, self.cpus)

    @property
    def cadence(self) -> Cadence:
        return Cadence(self.every_steps, self.every_s)

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_retries, self.max_preemptions)

    def checkpoint_dir(self) -> str:
        """The directory this trial claims. A prefix template that does not include {trial_id} can
        put two trials on one directory; the claim catches that, it is not prevented here."""
        prefix = self.checkpoint_prefix.format(trial_id=self.trial_id, **dict(self.params))
        return str(anchor.resolve(os.path.join(self.checkpoint_root, prefix)))  # inside a held search (the default): through it
