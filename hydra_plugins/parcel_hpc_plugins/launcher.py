"""Thin Hydra Launcher plugins: they carry the launcher config and build parcel_hpc dispatchers.

They do not implement Hydra's generic ``launch`` of arbitrary jobs: parcel_hpc dispatches governed
trials, not task-function calls, and refuses to be driven by another sweeper.
"""

from __future__ import annotations

from typing import Any, Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf


class _ParcelLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from parcel_hpc.errors import UsageError

        raise UsageError("the submitit launchers of parcel_hpc dispatch governed trials only; keep hydra/sweeper=parcel")


class LocalLauncher(_ParcelLauncher):
    def dispatcher(self, search, resources, max_retries: int):
        from parcel_hpc.sweep.dispatch import LocalDispatcher

        return LocalDispatcher(
            search.submitit_dir / "local", parallelism=int(self.params["parallelism"]),
            timeout_min=int(resources["time_limit_min"]), signal_delay_s=int(self.params["signal_delay_s"]),
            max_num_timeout=max_retries + 1,
        )


class SlurmLauncher(_ParcelLauncher):
    def dispatcher(self, search, resources, max_retries: int):
        from parcel_hpc.sweep.dispatch import SlurmDispatcher

        p = self.params
        return SlurmDispatcher(
            search.submitit_dir / "slurm", job_name=str(p["job_name"]), resources=resources,
            array_parallelism=int(p["array_parallelism"]), signal_delay_s=int(p["signal_delay_s"]),
            max_num_timeout=max_retries + 1, setup=list(p.get("setup") or []),
            additional=OmegaConf.to_container(p["additional_parameters"]) if isinstance(p.get("additional_parameters"), DictConfig) else dict(p.get("additional_parameters") or {}),
        )
