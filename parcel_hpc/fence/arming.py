"""Arming a process: both layers, once per set of protected files, for the rest of the process.

Must not: arm a process that must still read a protected file afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from parcel_hpc import fsio
from parcel_hpc.fence import audit, kernel
from parcel_hpc.fence.protected import Protected, Unfenceable
from parcel_hpc.ledger.events import FenceLayer


@dataclass(frozen=True)
class Armed:
    layer: FenceLayer
    note: str  # what the kernel layer holds, or why there is none


_armed: dict[Protected, Armed] = {}  # what this process armed: the next trial of a pack arms nothing twice


def arm(protected: Protected) -> Armed:
    """Fence this process from ``protected`` for the rest of its life. ``Unfenceable`` (nothing armed,
    and no trainer code may run) where a protected file has a second name or is mapped in memory."""
    if protected in _armed:
        return _armed[protected]
    problem = protected.refusal()
    if problem:
        raise Unfenceable(problem)
    protected.blind_descriptors()
    try:
        armed = Armed(FenceLayer.KERNEL, kernel.restrict(protected))
    except kernel.KernelUnavailable as exc:
        armed = Armed(FenceLayer.AUDIT, str(exc))
    fsio.whole_names()  # before the hook: the toolkit's own opens in a held folder must be judgeable
    audit.install(protected, kernel=armed.layer is FenceLayer.KERNEL)
    _armed[protected] = armed
    return armed


def is_armed() -> bool:
    """Whether this process is fenced (from any files)."""
    return bool(_armed)
