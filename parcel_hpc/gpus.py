"""A device list (``CUDA_VISIBLE_DEVICES``, ``SLURM_JOB_GPUS``) read one way wherever one is read: the
scheduler's grant, the local executor's pool, a trainer's devices, NVML's key for a device.

CUDA's rule (as torch reads it too): entries are separated by commas, blanks around them ignored.
The first entry sets the kind: ``GPU-``/``MIG-`` ids, else indices. The list ends at the first entry
not of that kind (``-1``, Slurm's ``NoDevFiles``), so ``0,-1,1`` is device 0 alone and ``-1`` hides
every device; a device named twice (``1,1``, ``0,00``) hides them all.
"""

from __future__ import annotations

_ID_PREFIXES = ("GPU-", "MIG-")


def visible_devices(listing: str | None) -> tuple[str, ...]:
    """The devices a list names, in its order, as CUDA would see them (empty for None or "");
    indices written plainly (``00`` is ``0``)."""
    entries = [entry.strip() for entry in (listing or "").split(",")]
    prefix = next((p for p in _ID_PREFIXES if entries[0].startswith(p)), None)
    named: list[str] = []
    for entry in entries:
        if prefix is not None and entry.startswith(prefix):
            device = entry
        elif prefix is None and is_index(entry):
            device = str(int(entry))
        else:
            break
        if device in named:
            return ()
        named.append(device)
    return tuple(named)


def is_index(entry: str) -> bool:
    """A device named by its number (ASCII digits; not by a UUID or MIG id)."""
    entry = entry.strip()
    return entry.isascii() and entry.isdigit()


def nvml_key(entry: str) -> int | str:
    """How NVML finds the device an entry names: by index (a number), else by UUID."""
    entry = entry.strip()
    return int(entry) if is_index(entry) else entry
