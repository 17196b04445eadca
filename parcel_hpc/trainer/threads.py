"""The CPUs an attempt was granted, bound to the libraries a trainer computes with.

A trial granted 2 CPUs on a shared node must not spin one thread per core: ``bind`` sets the
thread counts of OpenMP, MKL and OpenBLAS (their environment variables, read by a library when it
loads and by every process the trainer starts) and of torch's intra-op pool where torch is loaded
already (a pack's later trial); numpy's BLAS, loaded before the grant is known, is capped through
threadpoolctl where it is installed. The exact-metric references run with the same count.

Must not: import torch (``rng``'s rule: it is read from the process once a trainer imported it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def bind(cpus: int, env: MutableMapping[str, str] | None = None) -> None:
    """Every thread pool this process (and what it starts) computes with, at ``cpus`` threads."""
    n = max(1, int(cpus))
    target = os.environ if env is None else env
    for name in THREAD_ENV:
        target[name] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    try:  # optional (scikit-learn brings it): a BLAS loaded before the grant was known
        import threadpoolctl  # type: ignore[import-untyped,import-not-found,unused-ignore]  # no stubs; absent without scikit-learn
    except ImportError:
        return
    threadpoolctl.threadpool_limits(n)


def count() -> int | None:
    """torch's intra-op threads in this process; None where torch is not loaded."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())
