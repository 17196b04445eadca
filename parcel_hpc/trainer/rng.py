"""The process-wide random generators a trainer's step may draw from, saved and restored by name.

A trainer that draws from a global generator (Python's ``random``, ``np.random.*``, torch's dropout)
continues exactly after a resume only if its state holds that generator. ``process_rngs`` lists the
ones this process has: Python's and numpy's always, torch's once a trainer has imported torch
(``parcel_hpc.trainer.torch`` defines those; nothing here imports torch). The conformance check
runs each trainer with generators of its own, as in its own worker, and names the one a state left out.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]
Scalars = dict[str, Any]


@dataclass(frozen=True)
class ProcessRNG:
    name: str  # its arrays' and scalars' key (or key prefix) in a TrainerState
    words: str  # for people: which generator, and what draws from it
    save: Callable[[], tuple[Arrays, Scalars]]
    restore: Callable[[Mapping[str, np.ndarray], Mapping[str, Any]], None]  # a no-op where the state holds none of it
    reseed: Callable[[int], object]


def _save_python() -> tuple[Arrays, Scalars]:
    version, mt, gauss = random.getstate()
    return {"rng/python": np.array(mt, dtype=np.uint64)}, {"rng/python": [version, gauss]}


def _restore_python(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
    if "rng/python" in arrays:
        version, gauss = scalars["rng/python"]
        random.setstate((version, tuple(int(x) for x in arrays["rng/python"]), gauss))


def _save_numpy() -> tuple[Arrays, Scalars]:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {"rng/numpy": np.asarray(keys, dtype=np.uint32)}, {"rng/numpy": [str(kind), int(pos), int(has_gauss), float(cached)]}


def _restore_numpy(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
    if "rng/numpy" in arrays:
        kind, pos, has_gauss, cached = scalars["rng/numpy"]
        np.random.set_state((kind, np.asarray(arrays["rng/numpy"], dtype=np.uint32), int(pos), int(has_gauss), float(cached)))


PYTHON = ProcessRNG("rng/python", "Python's random module", _save_python, _restore_python, random.seed)
NUMPY = ProcessRNG("rng/numpy", "numpy's global generator (np.random.*)", _save_numpy, _restore_numpy, lambda seed: np.random.seed(seed % 2**32))


def process_rngs() -> tuple[ProcessRNG, ...]:
    """The global generators of this process: torch's only where a trainer imported torch."""
    if "torch" not in sys.modules:
        return (PYTHON, NUMPY)
    from parcel_hpc.trainer.torch import TORCH_RNGS  # torch is loaded already: no import of it here

    return (PYTHON, NUMPY, *TORCH_RNGS)


def save(rngs: Sequence[ProcessRNG] | None = None) -> tuple[Arrays, Scalars]:
    arrays: Arrays = {}
    scalars: Scalars = {}
    for rng in process_rngs() if rngs is None else rngs:
        a, s = rng.save()
        arrays |= a
        scalars |= s
    return arrays, scalars


def restore(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any], rngs: Sequence[ProcessRNG] | None = None) -> None:
    for rng in process_rngs() if rngs is None else rngs:
        rng.restore(arrays, scalars)


def reseed(seed: int) -> None:
    """Every global generator of this process from ``seed``."""
    for rng in process_rngs():
        rng.reseed(seed)
