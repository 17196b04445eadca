"""Dispatchers: hand worker tasks to a scheduler through submitit, on the local executor or as
SLURM array jobs. Decides nothing about which trials to run (``sweep`` does).

    base.py    Dispatcher (the interface), Submitted, LauncherSettings
    packing.py how many trials one job runs in turn, and which share a job (pure)
    local.py   LocalDispatcher: submitit's LocalExecutor (the embedded default)
    slurm.py   SlurmDispatcher: held sbatch arrays, released once the ledger has their ids
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import UsageError
from ..ledger import Executor, SearchDir
from . import packing
from .base import Dispatcher, LauncherSettings, Submitted
from .local import LocalDispatcher
from .slurm import SlurmDispatcher


def executor_kind(kind: str | None) -> Executor:
    """The launcher group's ``kind`` as an Executor, or one line saying which launchers exist
    (Hydra's own ``hydra/launcher=basic`` has no kind: it runs task functions, not governed trials)."""
    try:
        return Executor(kind)
    except ValueError:
        raise UsageError(f"launcher kind {kind!r} is not a parcel_hpc launcher; use hydra/launcher=submitit_local or submitit_slurm") from None


def make_dispatcher(settings: LauncherSettings, search: SearchDir, env: Mapping[str, str] | None = None) -> Dispatcher:
    """The dispatcher for a launch's settings (also as recorded in a launch, for resubmit)."""
    # submitit's own timeout countdown must never end a trial before parcel_hpc's retry policy does.
    max_num_timeout = int(settings.budget["max_retries"]) + int(settings.budget["max_preemptions"]) + 1
    if settings.kind is Executor.LOCAL:
        return LocalDispatcher(settings, search.submitit_dir / "local", max_num_timeout=max_num_timeout)
    return SlurmDispatcher(settings, search, max_num_timeout=max_num_timeout, env=os.environ if env is None else env)


__all__ = ["Dispatcher", "LauncherSettings", "LocalDispatcher", "SlurmDispatcher", "Submitted", "executor_kind", "make_dispatcher", "packing"]
