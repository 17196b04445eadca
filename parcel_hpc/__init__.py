"""parcel_hpc: governed model searches on SLURM clusters.

The public API is what a researcher's trainer and a script reading searches need; everything
else is reached by its module (docs/architecture.md lists the packages and what each owns).
Names resolve on first use, so ``import parcel_hpc.scheduler.packing`` (or a worker) pays for no
import it does not make.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from parcel_hpc.errors import ParcelError, UsageError
    from parcel_hpc.governance.contract import Contract
    from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
    from parcel_hpc.ledger import SearchDir, TrialRecord, TrialState
    from parcel_hpc.trainer import Diverged, Examples, InvalidPredictions, Trainer, TrainerState, TrainingData

    __version__: str

_PUBLIC = {
    "Contract": "parcel_hpc.governance.contract",
    "Diverged": "parcel_hpc.trainer",
    "Examples": "parcel_hpc.trainer",
    "GovernanceRefusal": "parcel_hpc.governance.outcome",
    "InvalidPredictions": "parcel_hpc.trainer",
    "Outcome": "parcel_hpc.governance.outcome",
    "ParcelError": "parcel_hpc.errors",
    "SearchDir": "parcel_hpc.ledger",
    "Trainer": "parcel_hpc.trainer",
    "TrainerState": "parcel_hpc.trainer",
    "TrainingData": "parcel_hpc.trainer",
    "TrialRecord": "parcel_hpc.ledger",
    "TrialState": "parcel_hpc.ledger",
    "UsageError": "parcel_hpc.errors",
}

__all__ = [
    "Contract",
    "Diverged",
    "Examples",
    "GovernanceRefusal",
    "InvalidPredictions",
    "Outcome",
    "ParcelError",
    "SearchDir",
    "Trainer",
    "TrainerState",
    "TrainingData",
    "TrialRecord",
    "TrialState",
    "UsageError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    if name == "__version__":  # on use: importlib.metadata costs every job and tool ~35 ms of CPU at start
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("parcel_hpc")
        except PackageNotFoundError:  # run from a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'parcel_hpc' has no attribute {name!r}")
