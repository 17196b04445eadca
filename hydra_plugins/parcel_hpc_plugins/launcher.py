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
    kind = "local"

    def dispatcher(self, search, resources, budget):
        from parcel_hpc.sweep.dispatch import make_dispatcher

        return make_dispatcher(self.kind, _plain(self.params), search, resources, budget)


class SlurmLauncher(LocalLauncher):
    kind = "slurm"


def _plain(params):
    return {k: OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) or OmegaConf.is_list(v) else v for k, v in params.items()}
