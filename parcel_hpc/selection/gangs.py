"""What a gang's trial is to a selection (issue 50): whether its checkpoint parts are replicas of one
model, the question asked before rank 0's part is taken as its selected artifact, and the line that
says what of its selection is not built yet.

A data-parallel gang's ranks hold the same weights after every step (the gradients' all-reduce gives
every rank the same sum), so rank 0's part is the model whose validation on rank 0 the trial was
selected by, and it serves alone. A sharded model's parts (each rank a slice of the weights) do not:
no one part is the model. The test is what the parts do, not how they are named: every rank's part,
loaded alone as rank 0's is, must predict the same frames bit for bit.

Must not: load a checkpoint or run trainer code (the selection job does, behind its fence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from parcel_hpc.governance.shape import TrialShape


def unlike_ranks(predictions: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The ranks whose part predicted otherwise than rank 0's (``predictions[r]``: rank r's part's
    probabilities on the same frames); empty: the parts are replicas and rank 0's serves for all."""
    return tuple(rank for rank, p in enumerate(predictions) if rank and not np.array_equal(p, predictions[0]))


def rerun_not_built(trial_id: str, shape: TrialShape) -> str:
    """Why a gang's trial cannot be selected yet, in one line: its rescore and final evaluation read
    rank 0's replica, but its rerun would be one rank, which is not the computation the gang ran (its
    batch rounding, its gradients' reduction order), so the rerun must be a gang of its shape."""
    return (
        f"{trial_id} is a trial of {shape.describe()}: its rerun as a gang of that shape is not built yet (docs/gangs.md); "
        "select a trial of one rank with --trial T --reason TEXT, where the search has one"
    )
