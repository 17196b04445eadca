"""Keeps trainer code away from the protected final partition's files while it runs.

Trainers get arrays, never paths (``trainer.data``); this is the second fence, for code that goes
looking: while armed, a Python-level open (``open``, ``os.open``, ``np.load``, ...) of a
``final-*.json`` file beside the split or of the snapshot file raises ``PermissionError`` and is
remembered, and the worker records the trial ``rejected``. It sees what Python's audit hooks see:
a C library opening a file by itself (h5py given a path) is not seen; that is for the image review.

Must not: be armed outside trainer calls (the toolkit's own loader and digests open these files).
"""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FINAL_PATTERN = "final-*.json"


class _Fence:
    def __init__(self) -> None:
        self.protected: tuple[str, frozenset[str]] | None = None  # (split directory, files)
        self.tripped: list[str] = []
        self.installed = False

    def __call__(self, event: str, args: tuple) -> None:
        if event != "open" or self.protected is None or not args or isinstance(args[0], int):
            return
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        split_dir, files = self.protected
        if path in files or (os.path.dirname(path) == split_dir and fnmatch.fnmatch(os.path.basename(path), FINAL_PATTERN)):
            self.tripped.append(path)
            raise PermissionError(f"{path} is protected from trainer code: trainers get their data from parcel_hpc.trainer.TrainingData")


_FENCE = _Fence()


@contextmanager
def protected_files(split_path: str | os.PathLike, snapshot_path: str | os.PathLike) -> Iterator[list[str]]:
    """Arm the fence while trainer code runs; yields the list of protected files it tried to open."""
    if not _FENCE.installed:
        sys.addaudithook(_FENCE)  # process-wide and permanent; inert while disarmed
        _FENCE.installed = True
    split_dir = os.path.realpath(Path(split_path).parent)
    _FENCE.protected = (split_dir, frozenset({os.path.realpath(snapshot_path)}))
    _FENCE.tripped = []
    try:
        yield _FENCE.tripped
    finally:
        _FENCE.protected = None
