"""The process-wide random generators a trainer's step may draw from, saved and restored by name.

A trainer that draws from a global generator (Python's ``random``, ``np.random.*``, torch's dropout)
continues exactly after a resume only if its state holds that generator. ``process_rngs`` lists the
ones this process has: Python's and numpy's always, torch's once a trainer has imported torch
(read from ``sys.modules``: nothing here imports torch). The conformance check
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


def _torch() -> Any:
    """The torch a trainer has imported: only ever called once it is in ``sys.modules``."""
    return sys.modules["torch"]


def _save_torch() -> tuple[Arrays, Scalars]:
    return {"rng/torch": _torch().get_rng_state().numpy()}, {}


def _restore_torch(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
    if "rng/torch" in arrays:
        torch = _torch()
        torch.set_rng_state(torch.from_numpy(np.array(arrays["rng/torch"], dtype=np.uint8)))


def _save_torch_cuda() -> tuple[Arrays, Scalars]:
    cuda = _torch().cuda
    if not (cuda.is_available() and cuda.is_initialized()):
        return {}, {}  # saving would start CUDA in a trainer that never used it
    return {f"rng/torch_cuda/{i}": s.numpy() for i, s in enumerate(cuda.get_rng_state_all())}, {}


def _restore_torch_cuda(arrays: Mapping[str, np.ndarray], scalars: Mapping[str, Any]) -> None:
    torch = _torch()
    saved = sorted((int(k.rsplit("/", 1)[1]), v) for k, v in arrays.items() if k.startswith("rng/torch_cuda/"))
    if saved and torch.cuda.is_available():
        # Index i is this process's i-th visible device, whichever physical GPU the resumed attempt got.
        for i, s in saved[: torch.cuda.device_count()]:
            torch.cuda.set_rng_state(torch.from_numpy(np.array(s, dtype=np.uint8)), i)


TORCH_RNGS = (
    ProcessRNG(
        "rng/torch",
        "torch's CPU generator (torch.get_rng_state: dropout, torch.rand, a DataLoader without a generator)",
        _save_torch,
        _restore_torch,
        lambda seed: _torch().manual_seed(seed),
    ),
    ProcessRNG(
        "rng/torch_cuda",
        "torch's CUDA generators (torch.cuda.get_rng_state_all: dropout on a GPU)",
        _save_torch_cuda,
        _restore_torch_cuda,
        lambda seed: _torch().cuda.manual_seed_all(seed),
    ),
)


def process_rngs() -> tuple[ProcessRNG, ...]:
    """The global generators of this process: torch's only where a trainer imported torch."""
    return (PYTHON, NUMPY, *TORCH_RNGS) if "torch" in sys.modules else (PYTHON, NUMPY)


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
