"""What an attempt used of the GPUs it was granted: their names, peak memory and mean utilization.

Read where each answers. torch, when the trainer imported it and put work on CUDA (never imported
here): the device names and ``max_memory_allocated``. NVML, the driver's own library, loaded with
ctypes and sampled once a second on a thread for utilization: no ``nvidia-smi``, because starting a
program in a fenced process trips the final partition's fence (``parcel_hpc.fence``), whatever thread
starts it. Where neither answers (no GPU, no driver), the record says so: utilization None, never 0.

Which NVML device a granted GPU is (``nvml_key``): ``CUDA_VISIBLE_DEVICES`` names it by UUID
(``GPU-...``, ``MIG-...``: exact) or by index, taken as NVML's index among the GPUs this process
sees. NVML numbers them in PCI bus order; CUDA does too under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and
its default (fastest first) agrees on a node of alike GPUs. Best effort, not checked: where the two
orders differ, an index reads another granted GPU's counters; a UUID prefix (CUDA accepts one)
finds no device, and NVML gives no utilization for a MIG instance: no reading, never a guess.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
from collections.abc import Sequence
from typing import Any

from parcel_hpc.gpus import nvml_key
from parcel_hpc.ledger import DeviceUse

SAMPLE_PERIOD_S = 1.0
NVML_LIBRARY = "libnvidia-ml.so.1"  # the driver's, found on the loader's path
_NVML_SUCCESS = 0


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """The few NVML calls a sampler needs, over a loaded ``libnvidia-ml`` (or a stand-in with the same calls)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    @classmethod
    def load(cls, library: str = NVML_LIBRARY) -> Nvml | None:
        """NVML initialised, or None where the driver's library is missing or refuses."""
        try:
            lib = ctypes.CDLL(library)
            return cls(lib) if lib.nvmlInit_v2() == _NVML_SUCCESS else None
        except (OSError, AttributeError):
            return None

    def handle(self, name: str) -> Any | None:
        """The device ``CUDA_VISIBLE_DEVICES`` calls ``name`` (an index or a UUID); None if NVML knows none."""
        handle = ctypes.c_void_p()
        key = nvml_key(name)
        if isinstance(key, int):
            found = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(key), ctypes.byref(handle))
        else:
            found = self.lib.nvmlDeviceGetHandleByUUID(key.encode(), ctypes.byref(handle))
        return handle if found == _NVML_SUCCESS else None

    def utilization(self, handle: Any) -> float | None:
        """The GPU's busy fraction over the driver's last sample period."""
        rates = _Utilization()
        return rates.gpu / 100.0 if self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == _NVML_SUCCESS else None

    def name(self, handle: Any) -> str | None:
        buffer = ctypes.create_string_buffer(96)
        return buffer.value.decode(errors="replace") if self.lib.nvmlDeviceGetName(handle, buffer, ctypes.c_uint(96)) == _NVML_SUCCESS else None

    def shutdown(self) -> None:
        self.lib.nvmlShutdown()


class UtilizationSampler:
    """Samples the granted GPUs' utilization on a daemon thread from ``start`` to ``stop``; inert
    (no thread) where no GPU is granted or NVML does not answer."""

    def __init__(self, visible: Sequence[str], nvml: Nvml | None = None, period_s: float = SAMPLE_PERIOD_S) -> None:
        self.nvml = nvml if nvml is not None or not visible else Nvml.load()
        self.handles = [h for h in (self.nvml.handle(v) for v in visible) if h is not None] if self.nvml is not None else []
        self.names = [n for n in (self.nvml.name(h) for h in self.handles) if n] if self.nvml is not None else []
        self.period_s = period_s
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> UtilizationSampler:
        torch = _torch_on_cuda()
        if torch is not None:  # a pack's earlier attempt ran in this process: its peak is not this one's
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)
        if self.handles:
            self._thread = threading.Thread(target=self._run, name="parcel-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        assert self.nvml is not None  # only called with handles, which need NVML
        self.readings += [u for u in (self.nvml.utilization(h) for h in self.handles) if u is not None]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.period_s)
            self.sample()  # the last stretch too: a short attempt may end before the first tick
        if self.nvml is not None:
            self.nvml.shutdown()
            self.nvml = None


def mean_utilization(readings: Sequence[float]) -> float | None:
    """The mean busy fraction; None without a reading (unknown, never idle)."""
    return round(sum(readings) / len(readings), 4) if readings else None


def loaded_frameworks() -> dict[str, str]:
    """The versions of the deep-learning frameworks this process imported (the trainer did)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found = {"torch": str(torch.__version__)}
    if getattr(torch.version, "cuda", None):
        found["cuda"] = str(torch.version.cuda)
    return found


def _torch_on_cuda() -> Any | None:
    """torch, where the trainer imported it and started CUDA; never starts CUDA itself."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


def running_on() -> str:
    """The device this process computes on, in words: the current CUDA device where the trainer put
    work there, else the CPU with its architecture (a serving estimate names where it was measured)."""
    torch = _torch_on_cuda()
    if torch is not None:
        return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    return f"cpu ({platform.machine() or 'unknown'})"


def device_use(granted: int, sampler: UtilizationSampler | None) -> DeviceUse:
    """The attempt's record, read at its end: ``granted`` GPUs, what torch and NVML say of them."""
    if granted == 0:
        return DeviceUse(("cpu",), frameworks=loaded_frameworks() or None)
    torch = _torch_on_cuda()
    names: list[str] = []
    peak = None
    if torch is not None:
        count = torch.cuda.device_count()
        names = [str(torch.cuda.get_device_name(i)) for i in range(count)]
        peak = max((int(torch.cuda.max_memory_allocated(i)) for i in range(count)), default=None)
    if not names and sampler is not None:
        names = list(sampler.names)
    readings = sampler.readings if sampler is not None else []
    return DeviceUse(tuple(names) or ("unknown",) * granted, peak, mean_utilization(readings), len(readings), loaded_frameworks() or None)
