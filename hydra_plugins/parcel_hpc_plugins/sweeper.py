"""The ``parcel`` Hydra sweeper, the thin class Hydra finds when it scans plugins (as
hydra-optuna-sweeper's): the logic, and the launch stack with submitit that it imports, are in
``_impl.py``, imported when Hydra builds this sweeper to run it, never when another app scans plugins.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig


class ParcelSweeper(Sweeper):
    def __init__(self, params: dict[str, str] | None = None) -> None:
        # Imported here, not at the top: Hydra imports every plugin module at each app's start.
        from hydra_plugins.parcel_hpc_plugins._impl import ParcelSweeperImpl

        self.sweeper = ParcelSweeperImpl(params)

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
