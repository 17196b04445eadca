"""PyTorch trainers' state, RNGs and devices: the tensor-to-array code every PyTorch user would write.

``pack`` turns the ``state_dict`` of each stateful object (modules, optimizers, LR schedulers, AMP
grad scalers), the step counter and every random generator a PyTorch step can draw from (Python's
``random``, numpy's global generator, torch's CPU generator, torch's CUDA generator of each device,
and any ``torch.Generator`` of your own, such as a sampler's) into a ``TrainerState``; ``unpack``
puts them back, so ``unpack(pack())`` continues exactly. ``device`` and ``devices`` bind a trainer
to the GPUs its attempt was granted, and refuse more; ``deterministic`` turns on the settings that
make a resumed trial end with the uninterrupted one's metric.

Optional: ``pip install parcel_hpc[torch]``. Nothing else in parcel_hpc imports torch; torch's
generators are ``rng``'s (``rng.TORCH_RNGS``), read from the torch a trainer has already imported.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import torch

from parcel_hpc.trainer import rng
from parcel_hpc.trainer.base import TrainerState, UnsavableState
from parcel_hpc.trainer.data import TrainingData

STEP = "step"
_SKELETON = "torch/skeleton"  # scalars key: each state_dict's structure, tensors replaced by array names
_TENSOR = "__tensor__"
_PAIRS = "__pairs__"  # a dict whose keys are not all strings (an optimizer's state is keyed by parameter index)
_TUPLE = "__tuple__"  # JSON has lists only; Adam's betas are a tuple
# dtypes numpy cannot hold: kept as same-width integers, bit for bit, and viewed back on load.
_BIT_VIEWS = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


class Stateful(Protocol):
    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


# --- state ----------------------------------------------------------------------------------------


def pack(
    stateful: Mapping[str, Stateful],
    *,
    step: int,
    generators: Mapping[str, torch.Generator] | None = None,
    arrays: Mapping[str, np.ndarray] | None = None,
    scalars: Mapping[str, Any] | None = None,
) -> TrainerState:
    """The whole state: each object's ``state_dict`` under its name, the step, every RNG, and your own extras.

    ``pack({"model": model, "optimizer": opt}, step=n, generators={"sampler": g})``. Tensors become
    read-only arrays named ``<name>/<path>`` (copies on the CPU, bit for bit); everything else in a ``state_dict``
    (learning rates, betas, a grad scaler's scale) rides in the scalars as JSON.
    """
    out_arrays: dict[str, np.ndarray] = dict(arrays or {})
    with _STAGING.pack():
        skeleton = {name: _flatten(obj.state_dict(), name, out_arrays) for name, obj in stateful.items()}
    rng_arrays, rng_scalars = rng.save()
    for name, gen in (generators or {}).items():
        rng_arrays[f"rng/generator/{name}"] = gen.get_state().numpy()
    out_scalars = dict(scalars or {}) | rng_scalars | {STEP: int(step), _SKELETON: skeleton}
    return TrainerState(out_arrays | rng_arrays, out_scalars)


def unpack(state: TrainerState, stateful: Mapping[str, Stateful], *, generators: Mapping[str, torch.Generator] | None = None, rngs: bool = True) -> int:
    """Load what ``pack`` saved into ``stateful`` and ``generators``, restore the global RNGs; the step.

    Call it after building the model and optimizer exactly as for a fresh start: ``load_state_dict``
    moves each tensor to where its parameter lives (the GPU a resumed attempt was granted may be
    another index than before). ``rngs=False`` leaves the global generators alone.
    """
    skeleton = state.scalars[_SKELETON]
    for name, obj in stateful.items():
        if name not in skeleton:
            raise KeyError(f"the state holds no {name!r}; it holds {', '.join(sorted(skeleton))}")
        obj.load_state_dict(_unflatten(skeleton[name], state.arrays))
    for name, gen in (generators or {}).items():
        gen.set_state(torch.from_numpy(np.array(state.arrays[f"rng/generator/{name}"], dtype=np.uint8)))
    if rngs:
        rng.restore(state.arrays, state.scalars)
    return int(state.scalars[STEP])


def _flatten(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON, each tensor moved into ``arrays`` and replaced by its name there."""
    if isinstance(value, torch.Tensor):
        arrays[path] = _to_array(value, path)
        return {_TENSOR: path, "dtype": str(value.dtype).removeprefix("torch."), "device": value.device.type}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value) and not {_TENSOR, _PAIRS, _TUPLE} & set(value):
            return {k: _flatten(v, f"{path}/{k}", arrays) for k, v in value.items()}
        return {_PAIRS: [[k, _flatten(v, f"{path}/{k}", arrays)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_flatten(v, f"{path}/{i}", arrays) for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UnsavableState(f"{path} is a {type(value).__name__}; a state_dict for parcel_hpc holds tensors, numbers, strings, lists and dicts")


def _unflatten(value: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(value, Mapping) and _TENSOR in value:
        return _to_tensor(arrays[value[_TENSOR]], value["dtype"])
    if isinstance(value, Mapping) and _PAIRS in value:
        return {k: _unflatten(v, arrays) for k, v in value[_PAIRS]}
    if isinstance(value, Mapping) and _TUPLE in value:
        return tuple(_unflatten(v, arrays) for v in value[_TUPLE])
    if isinstance(value, Mapping):
        return {k: _unflatten(v, arrays) for k, v in value.items()}
    if isinstance(value, list):
        return [_unflatten(v, arrays) for v in value]
    return value


def _to_array(tensor: torch.Tensor, path: str) -> np.ndarray:
    t = tensor.detach()
    if t.is_sparse or t.is_quantized:
        raise UnsavableState(f"{path} is a sparse or quantized tensor; convert it to a dense one in state_dict()")
    view = _BIT_VIEWS.get(t.dtype)
    source = t.view(view) if view is not None else t
    # One copy, straight into memory numpy owns: from a GPU it is the device-to-host copy itself (no
    # host tensor copied a second time), from a strided tensor no contiguous temporary.
    arr = _STAGING.take(tuple(source.shape), _numpy_dtype(source.dtype))
    torch.from_numpy(arr).copy_(source)
    arr.flags.writeable = False  # a snapshot nothing changes: a checkpoint written in the background takes it without a second copy
    return arr


class _Staging:
    """The host arrays ``pack`` copies large tensors into, each reused by a later ``pack`` once
    nothing but this pool holds it (its save written and its state dropped), so a large state costs
    one copy into memory already touched, not the page faults of fresh memory at every save (a third
    of the copy's time at 100 MiB). An array still referenced anywhere (a state a trainer keeps, a
    view of it, a tensor made from it, the writer writing it) is never written into: the reference
    count says so. Arrays neither this pack nor the previous one took are forgotten, so the pool
    holds at most two states' arrays: the one the run keeps as its last save, and the one the next
    save reuses. A small array (under ``POOLED_BYTES``) is allocated as before: the allocator's heap
    reuses freed memory without faults, and pooling thousands of them costs more than it saves.
    """

    POOLED_BYTES = 1 << 20

    def __init__(self) -> None:
        self._pool: dict[tuple[tuple[int, ...], np.dtype], list[np.ndarray]] = {}  # by shape and dtype
        self._taken: dict[int, int] = {}  # id of a pooled array -> the pack that last took it
        self._cursor: dict[tuple[tuple[int, ...], np.dtype], int] = {}  # each pooled array is looked at once a pack
        self._ends: dict[tuple[tuple[int, ...], np.dtype], int] = {}  # the arrays pooled before this pack
        self._packs = 0
        self._lock = threading.Lock()  # a pack on another thread (a framework's callback) takes its own

    @contextmanager
    def pack(self) -> Iterator[None]:
        with self._lock:
            self._packs += 1
            self._cursor = dict.fromkeys(self._pool, 0)
            self._ends = {key: len(arrays) for key, arrays in self._pool.items()}
            try:
                yield
            finally:
                self._forget_older()

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if math.prod(shape) * dtype.itemsize < self.POOLED_BYTES:
            return np.empty(shape, dtype=dtype)
        key = (shape, dtype)
        arrays = self._pool.setdefault(key, [])
        i, end = self._cursor.get(key, 0), self._ends.get(key, 0)
        while i < end:  # no local names the array before it is judged free: one would hold it
            if _holders(arrays, i) == _UNHELD:
                self._cursor[key] = i + 1
                self._taken[id(arrays[i])] = self._packs
                arrays[i].flags.writeable = True  # it owns its memory: only this pool makes it writeable again
                return arrays[i]
            i += 1
        self._cursor[key] = i
        arr = np.empty(shape, dtype=dtype)
        arrays.append(arr)
        self._taken[id(arr)] = self._packs
        return arr

    def _forget_older(self) -> None:
        """Keep what this pack or the previous one took."""
        for key, arrays in list(self._pool.items()):
            kept = []
            for arr in arrays:
                if self._taken[id(arr)] >= self._packs - 1:
                    kept.append(arr)
                else:
                    del self._taken[id(arr)]
            if kept:
                self._pool[key] = kept
            else:
                del self._pool[key]


def _holders(arrays: list[np.ndarray], i: int) -> int:
    """The reference count of ``arrays[i]`` as read from here (the list, this frame, the call's argument)."""
    arr = arrays[i]
    return sys.getrefcount(arr)


_UNHELD = _holders([np.empty(0)], 0)  # what it reads for an array only the pool holds, on this interpreter
_STAGING = _Staging()


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype  # numpy's TypeError for a dtype it has no equivalent of


def _to_tensor(array: np.ndarray, dtype_name: str) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    tensor = torch.from_numpy(np.array(array, copy=True))
    return tensor.view(dtype) if dtype in _BIT_VIEWS else tensor


# --- random generators ----------------------------------------------------------------------------


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators (CUDA's of every device too) from ``seed``."""
    rng.reseed(seed)


# --- devices --------------------------------------------------------------------------------------


def devices(data: TrainingData, count: int) -> list[torch.device]:
    """``count`` GPUs of the attempt's grant (``cuda:0`` .. ``cuda:count-1``, as CUDA_VISIBLE_DEVICES
    numbers them); ``DevicesNotGranted`` when that is more than the grant. Where the grant is not
    this process's (the launch's preflight, ``check-trainer``), the CPU stands in for each."""
    data.devices.require(count)
    if not data.devices.visible:
        return [torch.device("cpu")] * count
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < count:
        why = "a CPU build: install a CUDA build in the worker image" if torch.version.cuda is None else "check the node's driver with nvidia-smi"
        raise RuntimeError(f"the attempt was granted GPUs {','.join(data.devices.visible)} and torch {torch.__version__} sees {seen}; {why}")
    return [torch.device("cuda", i) for i in range(count)]


def device(data: TrainingData) -> torch.device:
    """The attempt's first granted GPU, or the CPU when it was granted none."""
    return devices(data, 1)[0] if data.devices.count else torch.device("cpu")


def deterministic() -> None:
    """Deterministic kernels, so a resumed trial repeats the uninterrupted one's arithmetic.

    On CUDA, cuBLAS needs a fixed workspace (set here before its first use) and cuDNN's autotuner
    is off; an op without a deterministic kernel raises rather than drift.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
