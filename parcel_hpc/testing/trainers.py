"""Trainers that break the interface on purpose, for tests of what the worker does with them.

Each is the built-in ``NumpyMLP`` with one fault; choose one with
``trainer.target=parcel_hpc.testing.trainers:<Name>``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from parcel_hpc.trainer import FinalPartitionRefused, Param, TrainerState, TrainingData
from parcel_hpc.trainer.numpy_mlp import NumpyMLP
from parcel_hpc.trainer.resume import K as RESUME_K

FAULT_STEP = 2 * RESUME_K + 1  # past the launch's preflight (k steps, a resume, k more): a trial finds it
PROTECTED_PATH_ENV = "PARCEL_TEST_PROTECTED_PATH"  # the file OpensProtectedFile tries to read


class AsksForFinal(NumpyMLP):
    """Asks for the final partition, swallows the refusal and trains on: still rejected."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        try:
            data.partition("final")
        except FinalPartitionRefused:
            pass


class OpensProtectedFile(NumpyMLP):
    """Knows where the final record lies and tries to read it at step 5."""

    def step(self) -> Mapping[str, float]:
        metrics = super().step()
        if self.steps_done == FAULT_STEP:
            try:
                with open(os.environ[PROTECTED_PATH_ENV], "rb") as f:
                    f.read(1)
            except PermissionError:
                pass
        return metrics


class OpensProtectedFileWhenBuilt(NumpyMLP):
    """Tries to read the final record as it is built: the launch's preflight builds it first."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        try:
            with open(os.environ[PROTECTED_PATH_ENV], "rb") as f:
                f.read(1)
        except PermissionError:
            pass


class ReadsProtectedFileThroughAProgram(NumpyMLP):
    """Reads the final record through ``cat`` at step 5, where Python's audit hook sees no open."""

    def step(self) -> Mapping[str, float]:
        metrics = super().step()
        if self.steps_done == FAULT_STEP:
            try:
                subprocess.run(["cat", os.environ[PROTECTED_PATH_ENV]], capture_output=True, check=False)
            except PermissionError:
                pass
        return metrics


class OpensProtectedFileWhenServing(NumpyMLP):
    """Trains like the built-in model, and tries to read the final record from its serving path,
    which only the selection jobs call."""

    def serve(self, images: np.ndarray) -> np.ndarray:
        try:
            with open(os.environ[PROTECTED_PATH_ENV], "rb") as f:
                f.read(1)
        except PermissionError:
            pass
        return super().serve(images)


class TakesFault(NumpyMLP):
    """The built-in model, taking the ``fault`` parameter the fault-injection hook reads (``faults.py``)."""

    parameters = {**NumpyMLP.parameters, "fault": Param(str, default="none")}

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        self.fault = params["fault"]  # the fault hook acts on it (``faults.py``); read here, as a declared parameter must be
        super().build(params, seed, data)


class Raises(NumpyMLP):
    def step(self) -> Mapping[str, float]:
        metrics = super().step()
        if self.steps_done == FAULT_STEP:
            raise RuntimeError(f"the trainer's own bug at step {FAULT_STEP}")
        return metrics


class NanLoss(NumpyMLP):
    def step(self) -> Mapping[str, float]:
        metrics = super().step()
        return {"loss": math.nan} if self.steps_done == FAULT_STEP else metrics


# The two below go wrong only after FAULT_STEP steps: a fault at the first step is the launch's
# preflight's to find (exit 2), before any trial runs.
class UnsavableStateTrainer(NumpyMLP):
    def state(self) -> TrainerState:
        state = super().state()
        if self.steps_done < FAULT_STEP:
            return state
        return TrainerState({**state.arrays, "vocabulary": np.array(["crushed", "torn"], dtype=object)}, state.scalars)


class WrongShapePredictions(NumpyMLP):
    def predict(self, split: str) -> np.ndarray:
        scores = super().predict(split)
        return scores if self.steps_done < FAULT_STEP else np.append(scores, 0.5)


class SkewedServing(NumpyMLP):
    """Training/serving skew: the serving path scales raw frames differently than training did."""

    def serve(self, images: np.ndarray) -> np.ndarray:
        return super().serve(np.asarray(images) * 0.9)


class ServesTheDataItWasBuiltWith(NumpyMLP):
    """Serves with the preprocessing its build was given, never the one in its state: right while it
    trains, NaN once built without examples (as a registry entry builds it): held at ``select``."""

    def load_state(self, state: TrainerState) -> None:
        kept = self.preprocessing
        super().load_state(state)
        self.preprocessing = kept


class Incomplete(NumpyMLP):
    """Forgets the serving path."""

    serve = None  # type: ignore[assignment]


def not_a_trainer() -> None:
    """A function where a class is expected."""


SLOW_PARAMS_ENV = "PARCEL_TEST_SLOW_PARAMS"  # JSON params: the trial drawn with them trains slowly
SLOW_STEP_S = 0.25


class SlowForSomeParams(NumpyMLP):
    """The built-in model, slow (``SLOW_STEP_S`` a step) for the one configuration named in
    ``PARCEL_TEST_SLOW_PARAMS``: a straggler among quick trials."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        wanted = json.loads(os.environ.get(SLOW_PARAMS_ENV, "null"))
        self.slow = wanted is not None and all(params.get(k) == v for k, v in wanted.items())

    def step(self) -> Mapping[str, float]:
        if self.slow:
            time.sleep(SLOW_STEP_S)
        return super().step()


class MissingParam(NumpyMLP):
    """Reads, at step ``FAULT_STEP`` (a schedule read late), a parameter nobody declared or gives:
    past the launch's preflight, every trial fails alike."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        self.params = dict(params)

    def step(self) -> Mapping[str, float]:
        if self.steps_done == FAULT_STEP:
            self.width = self.params["width_multiplier"]
        return super().step()


class FailsEachItsOwnWay(NumpyMLP):
    """Fails at step ``FAULT_STEP`` (past the preflight) with an exception class of its own per
    configuration: trials that all fail, none alike."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        self.tag = hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()[:6]

    def step(self) -> Mapping[str, float]:
        if self.steps_done == FAULT_STEP:
            raise type(f"Fault{self.tag.upper()}", (RuntimeError,), {})(f"configuration {self.tag} is broken its own way")
        return super().step()


class DeclaresUnread(NumpyMLP):
    """Declares a parameter its build never reads: the search would vary it and change nothing."""

    parameters = {**NumpyMLP.parameters, "momentum": Param(float, default=0.9)}


class CarriesBallast(NumpyMLP):
    """The built-in model with a large array in its state, changed in place at every step: a save takes
    long enough to be written while the next steps run (the background writer's tests)."""

    BALLAST = 4 << 20  # float64 values: 32 MiB more in every checkpoint

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        self.ballast = np.zeros(self.BALLAST)

    def step(self) -> Mapping[str, float]:
        self.ballast += 1.0  # equal to the steps done: a checkpoint shows which step's array it holds
        return super().step()

    def state(self) -> TrainerState:
        state = super().state()
        return TrainerState({**state.arrays, "ballast": self.ballast}, state.scalars)

    def load_state(self, state: TrainerState) -> None:
        super().load_state(TrainerState({k: v for k, v in state.arrays.items() if k != "ballast"}, state.scalars))
        self.ballast = np.array(state.arrays["ballast"])
