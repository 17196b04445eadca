"""Small helpers for tests that drive the dev SLURM cluster."""

import functools
import subprocess

from parcel_hpc.testing import runs

wait_for = functools.partial(runs.wait_for, every=1.0)  # the cluster's own pace: squeue once a second


def sh(*argv: str, check: bool = True, timeout: float = 60) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout
