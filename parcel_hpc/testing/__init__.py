"""Helpers that tests (ours and users') import: run the real launch and CLI as subprocesses, and a
task any dispatcher can run."""

from .runs import LaunchResult, launch, parcel_hpc, run_trial_directly, subprocess_env, wait_for
from .tasks import SleepTask

__all__ = ["LaunchResult", "SleepTask", "launch", "parcel_hpc", "run_trial_directly", "subprocess_env", "wait_for"]
