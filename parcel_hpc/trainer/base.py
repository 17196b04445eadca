"""The trainer interface: what a researcher's model gives parcel_hpc, and nothing more.

The toolkit owns the loop around a trainer (admission, the claim, signals, checkpoint cadence,
milestones and pruning, budgets, the ledger); the trainer owns the model. Its methods are called
only between steps, from one thread, so the state it hands out is always whole.

Must not: import anything of the worker; a trainer never sees paths, the ledger or the scheduler.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parcel_hpc.fsio import canonical_json

if TYPE_CHECKING:
    from parcel_hpc.trainer.data import TrainingData


class Diverged(FloatingPointError):
    """The loss, the parameters or the predictions stopped being finite: the trial fails ``diverged``."""


class UnsavableState(TypeError):
    """``Trainer.state`` returned something a checkpoint cannot hold: the trial fails ``unsavable_state``."""


class InvalidPredictions(ValueError):
    """``Trainer.predict`` returned no per-example probabilities: the trial fails ``invalid_predictions``."""


_ARRAY_KINDS = "biufc"  # numbers and bools: what a checkpoint stores byte for byte


@dataclass(frozen=True)
class TrainerState:
    """A trainer's whole state: named arrays (weights, optimizer moments, RNG keys) and JSON scalars.

    Array names may nest with '/' (``model/fc1.weight``), as in a flattened ``state_dict``. Scalars
    are JSON values (numbers, strings, lists, dicts), e.g. a numpy ``bit_generator.state``.
    """

    arrays: Mapping[str, np.ndarray]
    scalars: Mapping[str, Any] = field(default_factory=dict)

    def checked(self) -> TrainerState:
        """The same state with plain numpy arrays, or ``UnsavableState`` naming the first bad entry."""
        arrays = {}
        for name, value in self.arrays.items():
            if not isinstance(name, str) or not name:
                raise UnsavableState(f"state array name {name!r} is not a non-empty string")
            arr = np.asarray(value)
            if arr.dtype.kind not in _ARRAY_KINDS:
                raise UnsavableState(
                    f"state array {name!r} has dtype {arr.dtype}; checkpoints hold numeric or bool arrays (convert tensors with .cpu().numpy())"
                )
            arrays[name] = arr
        try:
            canonical_json(dict(self.scalars))
        except (TypeError, ValueError) as exc:
            raise UnsavableState(f"state scalars are not JSON values ({exc}); put arrays in TrainerState.arrays and give finite numbers") from None
        return TrainerState(arrays, dict(self.scalars))


class Trainer(ABC):
    """A model the toolkit can train, checkpoint, resume, score and serve.

    Lifecycle in one attempt: ``build`` once, then ``load_state`` when resuming, then ``step`` until
    the search's step count; ``state`` at the checkpoint cadence and on the scheduler's signal;
    ``predict("validation")`` at milestones. Two trainers built with the same params, seed and data
    must step identically, and ``load_state(state())`` must continue exactly where it left off:
    a preempted trial then ends with exactly the metric of an uninterrupted one.
    """

    unit: ClassVar[str] = "step"  # what one call of ``step`` advances: train.steps and milestones count these

    @abstractmethod
    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        """Make the model and optimizer from the trial's params and seed; keep ``data`` for training."""

    @abstractmethod
    def step(self) -> Mapping[str, float]:
        """Advance one unit; its training metrics (e.g. ``{"loss": 0.31}``), every value finite."""

    @abstractmethod
    def state(self) -> TrainerState:
        """The whole state, enough for ``load_state`` on a freshly built trainer to continue exactly."""

    @abstractmethod
    def load_state(self, state: TrainerState) -> None:
        """Take back a state given by ``state`` (after ``build`` with the same params, seed and data)."""

    @abstractmethod
    def predict(self, split: str) -> np.ndarray:
        """Probabilities that each example of ``split`` ("train" or "validation") needs review, shape (n,)."""

    @abstractmethod
    def serve(self, images: np.ndarray) -> np.ndarray:
        """The serving path: raw images (n, H, W) to probabilities (n,), from the trainer's state alone."""


REQUIRED_METHODS = tuple(sorted(Trainer.__abstractmethods__))


def finite_metrics(metrics: Mapping[str, float], step: int) -> dict[str, float]:
    """A step's metrics as plain floats; ``Diverged`` when one is not finite."""
    out = {}
    for name, value in dict(metrics or {}).items():
        number = float(value)
        if not math.isfinite(number):
            raise Diverged(f"training metric {name} is {number} at step {step}")
        out[str(name)] = number
    return out


def checked_probabilities(scores: Any, n: int, split: str, step: int) -> np.ndarray:
    """Predictions as float64 (n,); ``Diverged`` when not finite, ``InvalidPredictions`` otherwise wrong."""
    arr = np.asarray(scores)
    if arr.dtype.kind not in "biuf":
        raise InvalidPredictions(f"predict({split!r}) returned dtype {arr.dtype}; return probabilities as floats")
    arr = arr.astype(np.float64).reshape(-1) if arr.ndim == 2 and 1 in arr.shape else arr.astype(np.float64)
    if arr.shape != (n,):
        raise InvalidPredictions(f"predict({split!r}) returned shape {arr.shape} for {n} examples; return one probability per example")
    if not np.all(np.isfinite(arr)):
        raise Diverged(f"predict({split!r}) returned non-finite scores at step {step}")
    if arr.min(initial=0.0) < 0.0 or arr.max(initial=0.0) > 1.0:
        raise InvalidPredictions(f"predict({split!r}) returned scores outside [0, 1] at step {step}; return probabilities (apply a sigmoid)")
    return arr
