"""The run context of one attempt: a trainer's loop (its own, or the toolkit's) with the worker behind it.

Owns turning a ``WorkerPlan`` into what a loop is given (``Budget``, the pinned metric as its
validation score, the trial's params) and ``LoopRun``, the ``Run`` whose steps, saves and milestones
go to the callbacks it is given. The attempt (``attempt.py``) owns everything around it: admission,
the claim, the ledger, pruning decisions, the signal and how the attempt ends. The toolkit, not the
trainer, scores each milestone: the loop hands per-example probabilities, the pinned metric scores them.
Must not: write the ledger, or read the environment beyond loading the step hook named by
``PARCEL_HPC_STEP_HOOK`` (tests inject faults with it).
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from parcel_hpc.governance.metric import MissCost
from parcel_hpc.trainer import Trainer, TrainerState, TrainingData, build_params
from parcel_hpc.trainer.data import Budget
from parcel_hpc.trainer.function import run_loop
from parcel_hpc.trainer.run import Due, LoopError, Restored, Run, Stop
from parcel_hpc.worker.plan import WorkerPlan

STEP_HOOK_ENV = "PARCEL_HPC_STEP_HOOK"  # "package.module:function", called as f(params, step) after each step

StepHook = Callable[[Mapping[str, Any], int], None]


def step_hooks(env: Mapping[str, str] | None = None) -> tuple[StepHook, ...]:
    spec = (os.environ if env is None else env).get(STEP_HOOK_ENV, "")
    if not spec:
        return ()
    module, _, name = spec.partition(":")
    return (getattr(importlib.import_module(module), name),)


def budget(plan: WorkerPlan, unit: str = "step") -> Budget:
    """What the plan gives a trainer to spend (``TrainingData.budget``, ``Run.budget``)."""
    return Budget(int(plan.steps), tuple(sorted(int(m) for m in plan.pruner["milestones"])), plan.cadence, unit)


def scorer(plan: WorkerPlan, data: TrainingData) -> Callable[[np.ndarray], float]:
    """The contract's pinned metric on the validation labels."""
    metric = MissCost(plan.metric["revision"], float(plan.metric["miss_cost"]), float(plan.metric["review_cost"]))
    return lambda scores: metric(scores, data.validation.labels)


@dataclass(frozen=True)
class LoopCallbacks:
    restore: Callable[[], Restored | None]  # the trial's last good checkpoint
    stepped: Callable[[int], Stop | None]  # the loop finished this step (its state is whole): a stop it must obey
    save: Callable[[int, TrainerState], None]  # checkpoint this state, taken after this step
    validated: Callable[[int, float, bool, Mapping[str, float]], Stop | None]  # (step, value, final, train metrics): may stop it
    # A gang's rank 0 (``worker/gang.LeaderSide``): what every rank does after the step, the milestone;
    # None for a trial of one rank (what it decided itself).
    agreed: Callable[[Run, int, Due, Stop | None], tuple[Due, Stop | None]] | None = None  # (the run, step, due, stop)
    agreed_after_validation: Callable[[int, Stop | None], Stop | None] | None = None


class LoopRun(Run):
    """A ``Run`` whose effects are the callbacks'; the plan's step hooks and paced steps (tests') here."""

    def __init__(self, plan: WorkerPlan, trainer: Trainer, data: TrainingData, calls: LoopCallbacks, hooks: Sequence[StepHook] = ()) -> None:
        super().__init__(
            build_params(trainer, plan.params), plan.seed, replace(data, budget=budget(plan, type(trainer).unit)), scorer(plan, data), time.monotonic
        )
        self.plan, self.calls, self.hooks = plan, calls, tuple(hooks)
        self._started = time.monotonic()

    def _restore(self) -> Restored | None:
        return self.calls.restore()

    def _stepped(self, step: int) -> Stop | None:
        plan = self.plan
        for hook in self.hooks:
            hook(plan.params, step)
        if plan.step_seconds > 0:  # a paced step (the tests' slow trainers), counted from the last boundary
            scale = float(plan.params[plan.step_seconds_param]) if plan.step_seconds_param else 1.0
            time.sleep(max(0.0, plan.step_seconds * scale - (time.monotonic() - self._started)))
        stop = self.calls.stepped(step)
        self._started = time.monotonic()
        return stop

    def _save(self, step: int, state: TrainerState) -> None:
        self.calls.save(step, state)

    def _validated(self, step: int, value: float, final: bool, metrics: Mapping[str, float]) -> Stop | None:
        return self.calls.validated(step, value, final, metrics)

    def _agreed(self, step: int, due: Due, stop: Stop | None) -> tuple[Due, Stop | None]:
        agreed = self.calls.agreed
        return (due, stop) if agreed is None else agreed(self, step, due, stop)

    def _agreed_after_validation(self, step: int, stop: Stop | None) -> Stop | None:
        agreed = self.calls.agreed_after_validation
        return stop if agreed is None else agreed(step, stop)


def train(plan: WorkerPlan, trainer: Trainer, data: TrainingData, calls: LoopCallbacks, hooks: Sequence[StepHook] = ()) -> LoopRun:
    """Run ``trainer``'s loop (built) to ``plan.steps`` or a stop; the run, with its last step, value and stop.
    A loop that returns early without being told to, or never hands the last step's validation, broke the protocol."""
    run = LoopRun(plan, trainer, data, calls, hooks)
    run_loop(trainer, run)
    if run.stop is not None and run.stop.saves_first and run.saved_step != run.step and not run.done:
        raise LoopError(
            f"the loop returned at the scheduler's signal after step {run.step} without saving it; call run.save (or run.checkpoint_dir) when run.stepped says a checkpoint is due"
        )
    if run.stop is None and run.step < plan.steps:
        raise LoopError(f"the loop returned after step {run.step} of {plan.steps} without being told to stop; run every step of run.budget.steps")
    if run.stop is None and run.validated_step != plan.steps:
        raise LoopError(f"the loop never handed the validation probabilities at step {plan.steps}; call run.validate when run.stepped says so")
    return run
