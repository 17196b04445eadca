"""The ``hydra/launcher=submitit_local`` group's schema: trials as child processes of the launch.

A plain config group the parcel sweeper reads (no Launcher plugin behind it), registered by the
registry (``registry.register_launchers``) under the backend's ``launcher_name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parcel_hpc.scheduler.local import EXECUTOR


@dataclass
class SubmititLocalConf:
    """``hydra/launcher=submitit_local``: trials as child processes of the launch (the embedded default).
    The names follow hydra-submitit-launcher so its users feel at home."""

    kind: str = str(EXECUTOR)  # the backend it runs on
    parallelism: int = 2  # trials at once (processes)
    signal_delay_s: int = 30  # seconds before the time limit that the worker is told to checkpoint
    pack_size: Any = "auto"  # trials one process runs in turn: auto (docs/slurm-and-accounting.md, packed trials) or 1, 2, ...
    pack_minutes: float | None = None  # auto: expected work per process; null: the trials split evenly over the processes
    dispatch: str = (
        "auto"  # jobs: each process is handed its trials; slots: each takes the next trial (and proposal) when free; auto: slots where the sampler learns
    )
