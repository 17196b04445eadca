"""The backends by the executor a trial's jobs run on: the one module that names every backend.

Adding a backend is a package beside ``local/`` and ``slurm/`` (a ``base.Backend`` and its
dispatcher), an ``Executor`` value, and its line here (docs/architecture.md, "Adding a backend").
Order matters once: a job's environment is offered to each backend in turn, the local executor
(which recognises any environment) last.
"""

from __future__ import annotations

from parcel_hpc.ledger import Executor
from parcel_hpc.scheduler.base import Backend
from parcel_hpc.scheduler.local.backend import LocalBackend
from parcel_hpc.scheduler.slurm.backend import SlurmBackend

BACKENDS: tuple[Backend, ...] = (SlurmBackend(), LocalBackend())
DEFAULT = BACKENDS[-1]  # the embedded default: a search with no trial yet reads as this one's

_BY_EXECUTOR = {b.executor: b for b in BACKENDS}


def backend_of(executor: Executor | None) -> Backend:
    """The backend of jobs recorded with ``executor`` (None: a trial never submitted, the default's)."""
    return DEFAULT if executor is None else _BY_EXECUTOR[executor]
