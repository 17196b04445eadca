"""A device list (``CUDA_VISIBLE_DEVICES``, ``SLURM_JOB_GPUS``) read one way wherever one is read: the
scheduler's grant, the local executor's pool, a trainer's devices, NVML's key for a device.

CUDA's rule: entries are separated by commas (blanks around them ignored); an index, a ``GPU-`` or
a ``MIG-`` id names a device; the list ends at the first entry that names none (``-1``, Slurm's
``NoDevFiles``, an index given twice), so ``0,-1,1`` is device 0 alone and ``-1`` hides every device.
"""

from __future__ import annotations

_ID_PREFIXES = ("GPU-", "MIG-")


def visible_devices(listing: str | None) -> tuple[str, ...]:
    """The devices a list names, in its order, as CUDA would see them (empty for None or "")."""
    named: list[str] = []
    for entry in (listing or "").split(","):
        entry = entry.strip()
        if not (entry.isdigit() or entry.startswith(_ID_PREFIXES)) or entry in named:
            break
        named.append(entry)
    return tuple(named)


def is_index(entry: str) -> bool:
    """A device named by its number (not by a UUID or MIG id)."""
    return entry.strip().isdigit()


def nvml_key(entry: str) -> int | str:
    """How NVML finds the device an entry names: by index (a number), else by UUID."""
    entry = entry.strip()
    return int(entry) if is_index(entry) else entry
