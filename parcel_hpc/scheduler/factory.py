"""Which dispatcher runs a launch: the launcher group's ``kind`` mapped to its backend.

The one place that knows every backend; adding one is a package beside ``local/`` and ``slurm/``
and a line here (see docs/architecture.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from submitit.core.utils import JobPaths

from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings
from parcel_hpc.scheduler.local import dispatcher as local
from parcel_hpc.scheduler.local.dispatcher import LocalDispatcher
from parcel_hpc.scheduler.slurm import dispatcher as slurm
from parcel_hpc.scheduler.slurm.dispatcher import SlurmDispatcher


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
        return LocalDispatcher(settings, search, max_num_timeout=max_num_timeout)
    return SlurmDispatcher(settings, search, max_num_timeout=max_num_timeout, env=os.environ if env is None else env)


def job_logs(executor: Executor, search: SearchDir, job_id: str) -> tuple[Path, Path]:
    """The scheduler's output and error files of a trial job (submitit's names, one task a job)."""
    folder = local.job_folder(search) if executor is Executor.LOCAL else slurm.job_folder(search)
    paths = JobPaths(folder, job_id)
    return paths.stdout, paths.stderr
