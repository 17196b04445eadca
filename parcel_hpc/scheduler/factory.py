"""Which dispatcher runs a launch: the launcher group's ``kind`` mapped to its backend.

The backends themselves are named in ``registry.py``; this module only asks the launcher's backend for its dispatcher.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Executor, SearchDir
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings
from parcel_hpc.scheduler.registry import BACKENDS, backend_of, launchers


def executor_kind(kind: str | None) -> Executor:
    """The launcher group's ``kind`` as an Executor, or one line saying which launchers exist
    (Hydra's own ``hydra/launcher=basic`` has no kind: it runs task functions, not governed trials)."""
    backend = next((b for b in BACKENDS if b.executor == kind), None)
    if backend is None:
        raise UsageError(f"launcher kind {kind!r} is not a parcel_hpc launcher; use {launchers()}")
    return backend.executor


def make_dispatcher(settings: LauncherSettings, search: SearchDir, env: Mapping[str, str] | None = None) -> Dispatcher:
    """The dispatcher for a launch's settings (also as recorded in a launch, for resubmit)."""
    # submitit's own timeout countdown must never end a trial before parcel_hpc's retry policy does.
    max_num_timeout = int(settings.budget["max_retries"]) + int(settings.budget["max_preemptions"]) + 1
    return backend_of(settings.kind).dispatcher(settings, search, max_num_timeout, os.environ if env is None else env)
