"""The per-trial task that submitit runs: claim -> resume or start -> train -> milestones -> outcome.

One ``TrialTask`` call is one attempt. It records every step of its life in its own journal, so the
ledger can answer what ran, on what, how it ended. submitit calls ``checkpoint`` on the job's
signal (preemption or time limit): the task saves its last consistent state and asks to be
requeued under the same trial_id, unless the retry limit says otherwise.
"""

from __future__ import annotations

from typing import Any

from .jobenv import JobFacts, signal_cause
from .model import TrainState
from .plan import WorkerPlan


class TrialStopped(Exception):
    """The attempt must stop without a result (quarantined elsewhere, rejected)."""


class TrialTask:
    def __init__(self, plan: WorkerPlan) -> None:
        self.plan = plan
        self._state: TrainState | None = None
        self._run = None

    def __getstate__(self) -> dict:
        return {"plan": self.plan}  # runtime state lives in checkpoints, not in submitit's pickle

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["plan"])

    def __call__(self) -> dict:
        from ..fsio import no_world_writes
        from .attempt import AttemptRun

        no_world_writes()
        self._run = AttemptRun(self.plan, JobFacts.from_env(), self)
        return self._run.execute()

    def checkpoint(self, *args: Any, **kwargs: Any):
        """submitit's hook on SIGUSR2: save, record the interruption, requeue if the policy allows."""
        import submitit

        run = self._run
        if run is None:
            return submitit.helpers.DelayedSubmission(TrialTask(self.plan))
        if run.interrupt(signal_cause(run.facts)):
            return submitit.helpers.DelayedSubmission(TrialTask(self.plan))
        return None  # submitit then ends the job without requeue
