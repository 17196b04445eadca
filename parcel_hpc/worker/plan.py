"""What a worker is told to run: a small, picklable plan built by the sweep from the frozen contract.

The worker trusts nothing in it blindly: digests are recomputed from the files it opens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


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
    checkpoint_prefix: str = "{trial_id}"
    every_steps: int = 10
    keep_last: int = 2
    max_retries: int = 2
    max_preemptions: int = 10
    step_seconds: float = 0.0
    gpus: int = 0
    cpus: int = 1
    time_limit_min: int = 10

    def to_json(self) -> dict:
        from dataclasses import asdict

        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "WorkerPlan":
        return cls(**obj)

    def checkpoint_dir(self) -> str:
        """The directory this trial claims. A prefix template that does not include {trial_id} can
        put two trials on one directory; the claim catches that, it is not prevented here."""
        import os

        prefix = self.checkpoint_prefix.format(trial_id=self.trial_id, **dict(self.params))
        return os.path.join(self.checkpoint_root, prefix)
