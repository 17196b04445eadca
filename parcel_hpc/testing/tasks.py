"""A task any dispatcher can run that only sleeps: for dispatcher conformance tests.

It has what a dispatcher reads of a task (``scheduler.base.Task``: ``plans``, ``slot``, ``own_limits``,
``job_minutes``) and is importable by the
worker process that submitit starts, so it pickles by reference like the real task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc.governance.shape import TrialShape


@dataclass(frozen=True)
class SleepPlan:
    trial_id: str


class SleepTask:
    def __init__(self, trial_id: str, seconds: float, started: Path | None = None, packed_with: tuple[str, ...] = ()) -> None:
        self.plans = tuple(SleepPlan(t) for t in (trial_id, *packed_with))  # a pack: several trials, one job
        self.seconds = seconds
        self.started = started  # touched once the job runs, so a test can act on a running job
        self.own_limits = len(self.plans) > 1
        self.slot = ""
        self.shape = TrialShape()  # one process

    def job_minutes(self, time_limit_min: int) -> int:
        return len(self.plans) * time_limit_min

    def __call__(self) -> str:
        if self.started is not None:
            self.started.touch()
        time.sleep(self.seconds)
        return self.plans[0].trial_id
