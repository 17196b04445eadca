"""The served model: a trainer built without data, then given a released state.

``Trainer.serve`` answers "from the trainer's state alone", so serving builds the trainer with
``serving_data`` (no examples, the preprocessing unfitted) and loads the state: exactly what a
registry entry can give (``release.serving``, ``release.pyfunc``), and exactly what the selection's
serving-parity check runs (``selection.jobs``) and ``check-trainer`` tries, so a trainer that needs its
training data to serve is held at ``select``, never found out after its release.

Must not: read a file; what it builds from is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parcel_hpc.trainer.base import Trainer, TrainerState
from parcel_hpc.trainer.data import TrainingData
from parcel_hpc.trainer.target import build_params


def served(trainer: Trainer, params: Mapping[str, Any], seed: int, state: TrainerState, data: TrainingData) -> Trainer:
    """``trainer`` (unbuilt) built with the trial's ``params`` and ``seed`` on ``data`` (``serving_data``), given ``state``."""
    trainer.build(build_params(trainer, params), seed, data)
    trainer.load_state(state)
    return trainer
