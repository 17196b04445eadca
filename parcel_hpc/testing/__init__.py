"""Helpers that tests (ours and users') import: run the real launch and CLI as subprocesses, and a
task any dispatcher can run. Apart (they import more): ``dispatchers.FakeDispatcher``, a scheduler
in memory for unit tests of the follow loop; ``faults``, fault injection through the step hook;
``trainers``, trainers that break the interface on purpose; ``samples``, recorded sacct output."""

from parcel_hpc.testing.runs import LaunchResult, decide_every_hold, finish, launch, parcel_hpc, run_trial_directly, start_launch, subprocess_env, wait_for
from parcel_hpc.testing.tasks import SleepTask

__all__ = [
    "LaunchResult",
    "SleepTask",
    "decide_every_hold",
    "finish",
    "launch",
    "parcel_hpc",
    "run_trial_directly",
    "start_launch",
    "subprocess_env",
    "wait_for",
]
