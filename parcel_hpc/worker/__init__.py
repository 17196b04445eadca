"""The per-trial task: admit -> claim -> resume or start -> train -> milestones -> end.

task.py      TrialTask, what submitit pickles and runs (one call is one attempt)
attempt.py   AttemptRun: one attempt, every transition journaled
training.py  the training loop (steps, checkpoint cadence, validation)
plan.py      WorkerPlan, what the worker is told
jobenv.py    the scheduler's facts from the environment; preemption or time limit
model.py, features.py   the built-in numpy model and its features
quarantine.py           two trials on one checkpoint prefix
"""

from .plan import WorkerPlan
from .task import TrialTask

__all__ = ["TrialTask", "WorkerPlan"]
