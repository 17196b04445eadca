"""The training loop of one attempt: steps, checkpoint cadence, validation at milestones.

Owns the order of things inside the loop. The attempt (``attempt.py``) owns everything around it:
admission, the claim, the ledger, pruning decisions and how the attempt ends; the loop reaches
those only through the callbacks it is given. Must not write the ledger or read the environment
beyond loading the step hook named by ``PARCEL_HPC_STEP_HOOK`` (tests inject faults with it).
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..metric import MissCost
from .model import Diverged, Hyper, TrainState, predict_proba, train_step
from .plan import WorkerPlan

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
    on_state: Callable[[TrainState], None]  # the newest whole state (a signal handler checkpoints it)
    save: Callable[[TrainState], None]  # write a checkpoint of this state
    validated: Callable[[int, float, bool], None]  # (step, value, final): report; may stop the attempt


def hyper_of(plan: WorkerPlan) -> Hyper:
    # Unweighted loss keeps probabilities calibrated; the metric's threshold applies the costs.
    return Hyper.from_params(plan.params, pos_weight=1.0)


def train(
    plan: WorkerPlan, state: TrainState, data: Mapping[str, np.ndarray], calls: LoopCallbacks, hooks: Sequence[StepHook] = ()
) -> tuple[TrainState, float]:
    """Train from ``state`` to ``plan.steps``; the final state and its validation value."""
    hyper = hyper_of(plan)
    metric = MissCost(plan.metric["revision"], float(plan.metric["miss_cost"]), float(plan.metric["review_cost"]))
    milestones = {int(m) for m in plan.pruner["milestones"]}

    def validate(s: TrainState) -> float:
        value = metric(predict_proba(s.params, data["x_val"]), data["y_val"])
        if not math.isfinite(value):
            raise Diverged(f"validation metric is {value} at step {s.step}")
        return value

    value = math.nan
    while state.step < plan.steps:
        step_started = time.monotonic()
        state = train_step(state, data["x_train"], data["y_train"], hyper)
        for hook in hooks:
            hook(plan.params, state.step)
        calls.on_state(state)  # one reference swap: a signal handler always sees a whole state
        if plan.step_seconds > 0:
            time.sleep(max(0.0, plan.step_seconds - (time.monotonic() - step_started)))
        if state.step % plan.every_steps == 0 or state.step == plan.steps:
            calls.save(state)
        if state.step in milestones or state.step == plan.steps:
            value = validate(state)
            calls.validated(state.step, value, state.step == plan.steps)
    if not math.isfinite(value):  # resumed from the final checkpoint: score the state it holds
        value = validate(state)
        calls.validated(state.step, value, True)
    return state, value
