"""The backends by the executor a trial's jobs run on: the one module that names every backend.

Adding a backend is a package beside ``local/`` and ``slurm/`` (a ``base.Backend``, its dispatcher,
its executor name and its launcher group) and its line here (docs/architecture.md, "Adding a
backend"). Order matters once: a job's environment is offered to each backend in turn, the local
executor (which recognises any environment) last.
"""

from __future__ import annotations

from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Executor
from parcel_hpc.scheduler.base import Backend
from parcel_hpc.scheduler.local.backend import LocalBackend
from parcel_hpc.scheduler.slurm.backend import SlurmBackend

BACKENDS: tuple[Backend, ...] = (SlurmBackend(), LocalBackend())
DEFAULT = BACKENDS[-1]  # the embedded default: a search with no trial yet reads as this one's

_BY_EXECUTOR = {b.executor: b for b in BACKENDS}
assert len(_BY_EXECUTOR) == len(BACKENDS), "two backends declare one executor name"


def backend_of(executor: Executor | None) -> Backend:
    """The backend of jobs recorded with ``executor`` (None: a trial never submitted, the default's);
    one line (exit 2) for a name no backend here declares."""
    if executor is None:
        return DEFAULT
    if executor not in _BY_EXECUTOR:
        raise UsageError(
            f"jobs recorded as run on {executor!s} have no backend in this parcel_hpc (it has {launchers()}); read them with the parcel_hpc that ran them"
        )
    return _BY_EXECUTOR[executor]


def launchers() -> str:
    """The launcher groups a launch may name, for a message: ``hydra/launcher=<name>`` each."""
    return "hydra/launcher=" + " or ".join(sorted(b.launcher_name for b in BACKENDS))


def register_launchers() -> None:
    """Each backend's launcher group in Hydra's ConfigStore (the plugin's module calls this when
    Hydra scans it, so every composition has them)."""
    from hydra.core.config_store import ConfigStore  # here: a trial's worker, which never composes, loads no Hydra

    store = ConfigStore.instance()
    for b in BACKENDS:
        store.store(group="hydra/launcher", name=b.launcher_name, node=b.launcher, provider="parcel_hpc")
