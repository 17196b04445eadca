"""The training loop of one attempt: steps, checkpoint cadence, validation at milestones.

Owns the order of things inside the loop around a researcher's trainer. The attempt (``attempt.py``)
owns everything around it: admission, the claim, the ledger, pruning decisions and how the attempt
ends; the loop reaches those only through the callbacks it is given. The toolkit, not the trainer,
scores each milestone: it asks for per-example probabilities and applies the pinned metric.
Must not: write the ledger, or read the environment beyond loading the step hook named by
``PARCEL_HPC_STEP_HOOK`` (tests inject faults with it).
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import Trainer, TrainingData
from parcel_hpc.trainer.base import checked_probabilities, finite_metrics
from parcel_hpc.worker.plan import WorkerPlan

STEP_HOOK_ENV = "PARCEL_HPC_STEP_HOOK"  # "package.module:function", called as f(params, step) after each step

StepHook = Callable[[Mapping[str, Any], int], None]


def step_hooks(env: Mapping[str, str] | None = None) -> tuple[StepHook, ...]:
    spec = (os.environ if env is None else env).get(STEP_HOOK_ENV, "")
    if not spec:
        return ()
    module, _, name = spec.partition(":")
    return (getattr(importlib.import_module(module), name),)


@dataclass(frozen=True)
class LoopCallbacks:
    stepped: Callable[[int], None]  # the trainer finished this step: its state is whole
    save: Callable[[int], None]  # write a checkpoint of the trainer's state at this step
    validated: Callable[[int, float, bool, Mapping[str, float]], None]  # (step, value, final, train metrics): may stop the attempt
    boundary: Callable[[], None]  # between steps: the scheduler's held signal is delivered here


def train(plan: WorkerPlan, trainer: Trainer, data: TrainingData, step: int, calls: LoopCallbacks, hooks: Sequence[StepHook] = ()) -> tuple[int, float]:
    """Step ``trainer`` from ``step`` to ``plan.steps``; the final step and its validation value."""
    metric = MissCost(plan.metric["revision"], float(plan.metric["miss_cost"]), float(plan.metric["review_cost"]))
    milestones = {int(m) for m in plan.pruner["milestones"]}

    def validate(at: int) -> float:
        scores = checked_probabilities(trainer.predict("validation"), len(data.validation), "validation", at)
        return metric(scores, data.validation.labels)

    value = math.nan
    metrics: dict[str, float] = {}
    calls.boundary()  # a signal held while the trainer was built or restored
    while step < plan.steps:
        step_started = time.monotonic()
        metrics = finite_metrics(trainer.step(), step + 1)
        step += 1
        for hook in hooks:
            hook(plan.params, step)
        calls.stepped(step)
        if plan.step_seconds > 0:
            scale = float(plan.params[plan.step_seconds_param]) if plan.step_seconds_param else 1.0
            time.sleep(max(0.0, plan.step_seconds * scale - (time.monotonic() - step_started)))
        if step % plan.every_steps == 0 or step == plan.steps:
            calls.save(step)
        if step in milestones or step == plan.steps:
            value = validate(step)
            calls.validated(step, value, step == plan.steps, metrics)
        calls.boundary()
    if not math.isfinite(value):  # resumed from the final checkpoint: score the state it holds
        value = validate(step)
        calls.validated(step, value, True, metrics)
    return step, value
