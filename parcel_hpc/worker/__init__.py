"""The per-trial task: admit -> claim -> resume or start -> train -> milestones -> end.

gate.py      every job's first code: holds the search directory named on its command line, then submitit runs the task
task.py      TrialTask, what submitit pickles and runs: one or more trials in turn (a pack); a slot
             that takes its trials in turn is the launch's (``launch/slot.py``: it proposes too)
attempt.py   AttemptRun: one attempt, every transition journaled
training.py  the training loop around a trainer (steps, checkpoint cadence, validation)
signals.py   the scheduler's signal, held until the trainer is between steps
plan.py      WorkerPlan, what the worker is told
result.py    WorkerResult, what a job's task returns for each trial (typed: Ran)
jobenv.py    the scheduler's facts from the environment; preemption or time limit
cache.py     what a packed task's process observed once (digests, arrays) and reuses
quarantine.py two trials on one checkpoint prefix
"""

from parcel_hpc.worker.plan import WorkerPlan
from parcel_hpc.worker.task import TrialTask

__all__ = ["TrialTask", "WorkerPlan"]
