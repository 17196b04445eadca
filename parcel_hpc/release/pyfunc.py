"""The loader MLflow imports for a released model (the ``python_function`` flavor's ``loader_module``).

``mlflow.pyfunc.load_model("models:/NAME@champion")`` (or a folder entry's path) reads the entry's
``MLmodel``, imports this module and calls ``_load_pyfunc`` with the entry's folder: the entry is
checked whole and built as ``serving.load_release`` builds it (``serving.open_entry``: every file
against ``registered.json``, the code copy whole, the trainer built without examples and given its
state). What ``predict`` answers: the probability that each raw frame (float32 ``(n, H, W)`` in 0..1)
needs a damage review, float64 ``(n,)``.

MLflow's loader has trusted the entry's ``MLmodel`` before this module runs (it named the module to
import), so the ownership of the folder is not judged here: a copy MLflow downloaded lies in a
private temporary folder, and whoever could write the model's files could have named another
loader. ``load_release`` judges the registry's ownership before it reads a byte
(docs/faults-and-inputs.md). Must not: import mlflow, or write anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.release.serving import open_entry
from parcel_hpc.trainer import Trainer
from parcel_hpc.trainer.base import checked_probabilities


class ReleasedModel:
    """The released trainer behind MLflow's ``PyFuncModel.predict``."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def predict(self, model_input: Any) -> np.ndarray:
        frames = np.asarray(model_input, dtype=np.float32)
        return checked_probabilities(self.trainer.serve(frames), len(frames), "serving", 0)


def _load_pyfunc(data_path: str) -> ReleasedModel:
    """MLflow's entry point: ``data_path`` is the model's folder (the flavor names no data of its own)."""
    return ReleasedModel(open_entry(Path(os.path.abspath(data_path))))
