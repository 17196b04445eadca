"""What a gang's trial is to a selection (issue 50): whether its checkpoint parts are replicas of one
model, the question asked before rank 0's part is taken as its selected artifact (its rerun runs as a
gang of its own shape: ``jobs._gang_rerun``).

A data-parallel gang's ranks hold the same weights after every step (the gradients' all-reduce gives
every rank the same sum), so rank 0's part is the model whose validation on rank 0 the trial was
selected by, and it serves alone. A sharded model's parts (each rank a slice of the weights) do not:
no one part is the model. The test is what the parts do, not how they are named: every rank's part,
loaded alone as rank 0's is, must predict the same frames bit for bit.

Must not: load a checkpoint or run trainer code (the selection job does, behind its fence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parcel_hpc.governance.shape import TrialShape


def unlike_ranks(predictions: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The ranks whose part predicted otherwise than rank 0's (``predictions[r]``: rank r's part's
    probabilities on the same frames); empty: the parts are replicas and rank 0's serves for all."""
    return tuple(rank for rank, p in enumerate(predictions) if rank and not np.array_equal(p, predictions[0]))


def job_shape(resources: Mapping[str, Any], winner: TrialShape | None) -> TrialShape:
    """The shape a selection job runs as: a gang's rerun as a gang of the ``winner``'s own shape (the
    rerun is held to the gang's value, which one rank does not reproduce: docs/gangs.md); every other
    job as one rank with the search's ``resources``."""
    return winner if winner is not None and winner.is_gang else TrialShape(gpus_per_rank=int(resources["gpus"]), cpus_per_rank=int(resources["cpus"]))
