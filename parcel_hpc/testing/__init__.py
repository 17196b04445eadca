"""Helpers that tests (ours and users') import: run the real launch and CLI as subprocesses."""

from .runs import LaunchResult, launch, parcel_hpc, run_trial_directly

__all__ = ["LaunchResult", "launch", "parcel_hpc", "run_trial_directly"]
