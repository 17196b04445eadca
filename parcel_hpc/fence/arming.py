"""Arming a process: both layers, once per set of protected files, for the rest of the process.

Must not: arm a process that must still read a protected file afterwards.
"""

from __future__ import annotations

import os
import stat
import tempfile
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
    own_tempdir(protected)
    compile_settings()
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


COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")  # where torch.compile keeps what it built, when the user says
COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"


def compile_settings() -> None:
    """Make the compile caches the environment names, now: once fenced, a folder on the way to a
    protected file takes no new entry, and the cache's parent may be one. And compile in this
    process unless the user says otherwise: with Triton installed (torch's CUDA builds) inductor
    otherwise starts a pool of Python compile workers, which the fence refuses (``compiler.py``)."""
    for name in COMPILE_CACHES:
        if os.environ.get(name):
            os.makedirs(os.environ[name], mode=0o700, exist_ok=True)
    os.environ.setdefault(COMPILE_THREADS, "1")  # read when torch._inductor.config is imported: after arming


def own_tempdir(protected: Protected) -> str:
    """The temporary folder this process (``tempfile``, ``TMPDIR`` for the programs it starts, torch's
    compile cache below it) writes in once fenced. Where a protected file lies below the system's, a
    fenced process could make nothing new there (it is on the way to that file), so the process gets
    a folder of its user's, made in it now, before arming; else the system's stays."""
    system = os.path.realpath(tempfile.gettempdir())
    if not any(path.startswith(system + "/") for path in (*protected.paths, protected.split_dir)):
        return system
    folder = os.path.join(system, f"parcel-hpc-fenced-{os.getuid()}")  # one per user: torch's compile cache outlives a worker
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        folder = tempfile.mkdtemp(prefix="parcel-hpc-fenced-", dir=system)  # someone else's name in a shared /tmp: a fresh one
    os.environ["TMPDIR"] = tempfile.tempdir = folder
    return folder
