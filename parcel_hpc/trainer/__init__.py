"""Bring your own model: the trainer forms the governance wraps (docs/bring-your-own-model.md).

A researcher keeps their loop (``@loop`` over ``def train(run)``, talking to the toolkit through the
run context ``Run``), or subclasses ``Trainer`` (build, step, state/load_state, predict, serve) and
lets the toolkit's loop drive it; either is chosen with ``trainer.target=PACKAGE.MODULE:NAME`` and
runs inside everything parcel_hpc guarantees. ``NumpyMLP`` (``trainer=numpy_mlp``) is the built-in
reference implementation.
"""

from parcel_hpc.trainer.base import Diverged, InvalidPredictions, Trainer, TrainerState, UnsavableState
from parcel_hpc.trainer.data import (
    FINAL_PARTITION_OUTCOME,
    Budget,
    Devices,
    DevicesNotGranted,
    Examples,
    FinalPartitionRefused,
    TrainingData,
    load_training_data,
    serving_data,
)
from parcel_hpc.trainer.function import FunctionTrainer, loop, run_loop
from parcel_hpc.trainer.params import Param
from parcel_hpc.trainer.run import Due, Restored, Run, Stop, StopTraining
from parcel_hpc.trainer.served import served
from parcel_hpc.trainer.target import BUILTIN, build_params, make_trainer, trainer_class, trainer_identity

__all__ = [
    "Budget",
    "Due",
    "FunctionTrainer",
    "Restored",
    "Run",
    "Stop",
    "StopTraining",
    "loop",
    "run_loop",
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
