"""Keeps trainer code away from the protected final partition's files while it runs.

Trainers get arrays, never paths (``trainer.data``); this is the second fence, for code that goes
looking: while armed, a Python-level open (``open``, ``os.open``, ``np.load``, ...) of a
``final-*.json`` file beside the split or of the snapshot file raises ``PermissionError`` and is
remembered, and the worker records the trial ``rejected``. It sees what Python's audit hooks see:
a C library opening a file by itself (h5py given a path) is not seen; that is for the image review.
A program started from trainer code (``subprocess``, ``os.system``, ``os.exec*``, ``os.spawn*``,
``os.posix_spawn``) runs without the hook, so what it opens is out of sight: starting one is
refused and remembered the same way. A forked child keeps the hook; a ``multiprocessing`` child
started by "spawn" or "forkserver" runs a fresh interpreter without it, and is not seen either.

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
# Audit events that start another program: it would run outside this process's hook.
PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "pty.spawn"})


class _Fence:
    def __init__(self) -> None:
        self.protected: tuple[str, frozenset[str]] | None = None  # (split directory, files)
        self.suspended: tuple[str, frozenset[str]] | None = None  # what ``unfenced`` lifted, for ``refenced``
        self.tripped: list[str] = []  # what trainer code tried, in words
        self.installed = False

    def __call__(self, event: str, args: tuple) -> None:
        if self.protected is None:
            return
        if event in PROGRAM_EVENTS:
            program = _program(event, args)
            self.tripped.append(f"started the program {program} (what a program opens is out of the fence's sight)")
            raise PermissionError(f"trainer code may not start a program ({program}) while it trains: the final partition's fence cannot see its opens")
        if event != "open" or not args or isinstance(args[0], int):
            return
        try:
            path = os.path.realpath(os.fsdecode(args[0]))
        except (TypeError, ValueError):
            return
        split_dir, files = self.protected
        if path in files or (os.path.dirname(path) == split_dir and fnmatch.fnmatch(os.path.basename(path), FINAL_PATTERN)):
            self.tripped.append(f"opened {path}")
            raise PermissionError(f"{path} is protected from trainer code: trainers get their data from parcel_hpc.trainer.TrainingData")


def _program(event: str, args: tuple) -> str:
    """The program an audit event starts, in one short line (the event's name when it names none)."""
    # subprocess.Popen: (executable, args, cwd, env), executable None unless given; os.spawn: (mode, path, ...).
    found = next((a for a in (args[1:2] if event == "os.spawn" else args[:2]) if a), None)
    if isinstance(found, (list, tuple)):
        found = found[0] if found else None
    text = os.fsdecode(found) if isinstance(found, (str, bytes, os.PathLike)) else event
    return " ".join(text.split())[:200]


_FENCE = _Fence()


@contextmanager
def protected_files(split_path: str | os.PathLike, snapshot_path: str | os.PathLike) -> Iterator[list[str]]:
    """Arm the fence while trainer code runs; yields what it tried ("opened <path>", "started the program ...")."""
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


@contextmanager
def unfenced() -> Iterator[None]:
    """The toolkit's own code called while trainer code is fenced (the scheduler's signal, handled
    between steps: submitit requeues the job through ``scontrol``): its programs and opens are not
    the trainer's. Trainer code it calls in turn goes back behind the fence (``refenced``)."""
    protected, suspended = _FENCE.protected, _FENCE.suspended
    _FENCE.protected, _FENCE.suspended = None, protected or suspended
    try:
        yield
    finally:
        _FENCE.protected, _FENCE.suspended = protected, suspended


@contextmanager
def refenced() -> Iterator[None]:
    """Trainer code called from inside ``unfenced`` toolkit code (its ``state()`` saved on the
    scheduler's signal): fenced as in its steps. Outside any fence it stays unfenced."""
    protected, _FENCE.protected = _FENCE.protected, _FENCE.suspended
    try:
        yield
    finally:
        _FENCE.protected = protected
