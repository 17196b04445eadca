"""Helpers that tests (ours and users') import: run the real launch and CLI as subprocesses, and a
task any dispatcher can run. Apart (they import more): ``dispatchers.FakeDispatcher``, a scheduler
in memory for unit tests of the follow loop; ``faults``, fault injection through the step hook;
``trainers``, trainers that break the interface on purpose; ``samples``, recorded sacct output.

Names resolve on first use: the fake cluster's tools (``fakeslurm``, a process per ``squeue`` or
``sacct``) live under this package and would otherwise import the ledger and numpy for each call."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parcel_hpc.testing.runs import LaunchResult, decide_every_hold, finish, launch, parcel_hpc, run_trial_directly, start_launch, subprocess_env, wait_for
    from parcel_hpc.testing.tasks import SleepTask

_PUBLIC = {
    "LaunchResult": "parcel_hpc.testing.runs",
    "SleepTask": "parcel_hpc.testing.tasks",
    "decide_every_hold": "parcel_hpc.testing.runs",
    "finish": "parcel_hpc.testing.runs",
    "launch": "parcel_hpc.testing.runs",
    "parcel_hpc": "parcel_hpc.testing.runs",
    "run_trial_directly": "parcel_hpc.testing.runs",
    "start_launch": "parcel_hpc.testing.runs",
    "subprocess_env": "parcel_hpc.testing.runs",
    "wait_for": "parcel_hpc.testing.runs",
}

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


if not TYPE_CHECKING:  # mypy reads the imports above: a name not among them stays an error, not Any

    def __getattr__(name: str) -> Any:
        if name in _PUBLIC:
            return getattr(importlib.import_module(_PUBLIC[name]), name)
        raise AttributeError(f"module 'parcel_hpc.testing' has no attribute {name!r}")
