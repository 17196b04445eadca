"""The function form: a trainer that keeps its own loop (``@loop``), and the one way to run either form.

A researcher writes ``def train(run): ...`` (their loop, talking to the toolkit through the run
context, ``run.py``) and ``def load(state, params, seed, data)``, the serving entry: a predictor
(raw images (n, H, W) to probabilities (n,)) from a saved state alone. ``@loop(parameters=...,
load=load)`` makes the decorated name the trainer ``trainer.target`` names: a ``FunctionTrainer``
class, so the launch, the identity, the code copy, selection and release handle it as they handle a
class-form trainer (``build`` keeps what it is given, ``load_state`` a saved state, ``predict`` and
``serve`` answer through ``load``). ``run_loop`` runs a trainer of either form with a ``Run``: the
function form's own loop, or the class form through the toolkit's ``drive``.

Must not: read a path or the environment; the loop is the researcher's, the run the toolkit's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from parcel_hpc.trainer.base import Trainer, TrainerState
from parcel_hpc.trainer.data import TrainingData
from parcel_hpc.trainer.params import Param
from parcel_hpc.trainer.run import LoopError, Run, StopTraining, drive

Predictor = Callable[[np.ndarray], Any]
Loader = Callable[[TrainerState, Mapping[str, Any], int, TrainingData], Predictor]


class FunctionTrainer(Trainer):
    """A function-form trainer as the toolkit handles every trainer outside its loop."""

    function: ClassVar[Callable[[Run], None]]
    loader: ClassVar[Loader]

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        self.params, self.seed, self.data = params, seed, data
        self._state: TrainerState | None = None
        self._predictor: Predictor | None = None

    def step(self) -> Mapping[str, float]:
        raise LoopError(f"{type(self).__name__} owns its loop; the toolkit runs it with a Run (parcel_hpc.trainer.run_loop)")

    def state(self) -> TrainerState:
        if self._state is None:
            raise LoopError(f"{type(self).__name__} has no state yet: its loop saved none (run.save at the steps run.stepped says)")
        return self._state

    def load_state(self, state: TrainerState) -> None:
        self._state, self._predictor = state, None

    def predict(self, split: str) -> np.ndarray:
        return np.asarray(self._served()(self.data.partition(split).images))

    def serve(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self._served()(images))

    def _served(self) -> Predictor:
        if self._predictor is None:
            self._predictor = type(self).loader(self.state(), self.params, self.seed, self.data)
        return self._predictor


def loop(*, parameters: Mapping[str, Param], load: Loader, unit: str = "step") -> Callable[[Callable[[Run], None]], type[FunctionTrainer]]:
    """``@loop(parameters={"lr": Param(float)}, load=load)`` over ``def train(run): ...``: the trainer
    ``trainer.target=PKG.MOD:train`` names. ``load(state, params, seed, data)`` gives the predictor a
    registry entry serves, built without examples (``data`` holds none) from ``state`` alone."""

    def make(function: Callable[[Run], None]) -> type[FunctionTrainer]:
        namespace = {
            "__module__": function.__module__,
            "__qualname__": function.__qualname__,
            "__doc__": function.__doc__,
            "function": staticmethod(function),
            "loader": staticmethod(load),
            "parameters": dict(parameters),
            "unit": unit,
        }
        return type(function.__name__, (FunctionTrainer,), namespace)

    return make


def run_loop(trainer: Trainer, run: Run) -> None:
    """Train ``trainer`` (built) with ``run``: its own loop, or the toolkit's. A function-form trainer
    then holds the last state its loop saved (what selection scores and releases)."""
    try:
        if isinstance(trainer, FunctionTrainer):
            type(trainer).function(run)
        else:
            drive(trainer, run)
    except StopTraining:
        pass  # the loop called its run again after a stop: the stop is on the run
    if isinstance(trainer, FunctionTrainer) and run.last_saved is not None:
        trainer.load_state(run.last_saved)
