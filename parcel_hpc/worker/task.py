"""The per-trial task that submitit runs: one call is one attempt (``attempt.AttemptRun``).

submitit calls ``checkpoint`` on the job's signal (preemption or time limit): the running attempt
saves its last consistent state and says whether to be requeued under the same trial_id.
"""

from __future__ import annotations

from typing import Any

import submitit

from ..fsio import no_world_writes
from .attempt import AttemptRun
from .jobenv import facts_from_env, signal_cause
from .plan import WorkerPlan


class TrialTask:
    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self._run: AttemptRun | None = None

    def __getstate__(self) -> dict:
        return {"plan": self.plan}  # runtime state lives in checkpoints, not in submitit's pickle

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["plan"])

    def __call__(self) -> dict:
        no_world_writes()
        self._run = AttemptRun(self.plan, facts_from_env())
        return self._run.execute()

    def checkpoint(self, *_args: Any, **_kwargs: Any) -> submitit.helpers.DelayedSubmission | None:
        """submitit's hook on SIGUSR2: save, record the interruption, requeue if the policy allows."""
        run = self._run
        if run is None or run.interrupt(signal_cause(run.facts)):
            return submitit.helpers.DelayedSubmission(TrialTask(self.plan))
        return None  # submitit then ends the job without requeue
