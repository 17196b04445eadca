"""Bring your own model: the trainer interface the governance wraps (docs/bring-your-own-model.md).

A researcher subclasses ``Trainer`` (build, step, state/load_state, predict, serve) and chooses it
with ``trainer.target=PACKAGE.MODULE:NAME``; the worker runs it inside everything parcel_hpc
guarantees. ``NumpyMLP`` (``trainer=numpy_mlp``) is the built-in reference implementation.
"""

from parcel_hpc.trainer.base import Diverged, InvalidPredictions, Trainer, TrainerState, UnsavableState
from parcel_hpc.trainer.data import (
    FINAL_PARTITION_OUTCOME,
    Devices,
    DevicesNotGranted,
    Examples,
    FinalPartitionRefused,
    TrainingData,
    load_training_data,
    serving_data,
)
from parcel_hpc.trainer.params import Param
from parcel_hpc.trainer.served import served
from parcel_hpc.trainer.target import BUILTIN, build_params, make_trainer, trainer_class, trainer_identity

__all__ = [
    "BUILTIN",
    "FINAL_PARTITION_OUTCOME",
    "Devices",
    "DevicesNotGranted",
    "Diverged",
    "Examples",
    "FinalPartitionRefused",
    "InvalidPredictions",
    "Param",
    "Trainer",
    "TrainerState",
    "TrainingData",
    "UnsavableState",
    "build_params",
    "load_training_data",
    "make_trainer",
    "served",
    "serving_data",
    "trainer_class",
    "trainer_identity",
]
