"""Checkpoints written off the training path: one writer thread behind a ``CheckpointStore``.

Owns when a save's bytes reach the disk: ``submit`` checks the state and copies every array out of
the caller's memory (training may change its own at once), then one thread writes, hashes, fsyncs
and renames it through the store exactly as a synchronous save does, so the file format, the claim
check, the digests and crash consistency are the store's, unchanged. At most one save is in flight:
a save submitted while the previous one is still writing waits for it (never skipped: a skipped
save would make which steps hold a checkpoint depend on the disk's speed); the wait is counted in
``waited_s``. An error in the writer is raised, unchanged, by the next ``submit`` or ``wait``.

Must not: decide when to save (``cadence.py``), or let a process leave with a save in flight:
whoever ends an attempt calls ``wait`` first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from parcel_hpc.checkpoints.store import Prepared

THREAD_NAME = "parcel-checkpoint"  # the writer thread's name, with the step it writes


class Saves(Protocol):
    """What the writer writes through: a trial's ``CheckpointStore``, or one rank's ``GangCheckpoints``."""

    def prepare(
        self,
        step: int,
        params: Mapping[str, np.ndarray],
        optimizer: Mapping[str, np.ndarray],
        rng_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        *,
        copy: bool = False,
    ) -> Prepared: ...

    def write(self, prepared: Prepared) -> Path: ...


class BackgroundWriter:
    """Saves of one store, written by one thread at a time while the caller goes on."""

    def __init__(self, store: Saves) -> None:
        self.store = store
        self.waited_s = 0.0  # time submit spent waiting for the previous save to be written
        self.last: Path | None = None  # the newest file written durably
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self,
        step: int,
        params: Mapping[str, np.ndarray],
        optimizer: Mapping[str, np.ndarray],
        rng_state: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """Check and copy the state now (a ``UsageError`` names a bad value), write it in the background.
        ``clock`` (a ``time.monotonic``) measures the wait for the previous save; None: not measured."""
        prepared = self.store.prepare(step, params, optimizer, rng_state, extra, copy=True)
        began = clock() if clock is not None else 0.0
        self.wait()
        if clock is not None:
            self.waited_s += clock() - began
        self._thread = threading.Thread(target=self._write, args=(prepared,), name=f"{THREAD_NAME}-{step}")
        self._thread.start()

    def wait(self) -> Path | None:
        """Block until no save is in flight; the newest file written, or the writer's error raised."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
        return self.last

    @property
    def busy(self) -> bool:
        """A save is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def _write(self, prepared: Prepared) -> None:
        try:
            self.last = self.store.write(prepared)
        except BaseException as exc:  # handed to the training thread: raised by its next submit or wait
            self._error = exc
