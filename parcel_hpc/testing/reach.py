"""A trainer that tries a way past the final partition's fence in every trial of a pack, for the fence's tests.

Active with ``REACH_DIR_ENV`` set, and only in a worker (``SUBMITIT_LOCAL_JOB_ID`` is set: the launch
imports and builds it too) unless ``REACH_AT_LAUNCH_ENV`` is set as well. The first way, ``import``, runs when the worker imports this module; each
trial's trainer then takes the next way in ``WAYS`` as it is made (``__init__``) and tries it there or
in ``build``. Whatever bytes a way got back are written to ``seen-<n>`` in that folder, so a test can
tell that none of the protected file reached trainer code, whatever the worker recorded.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from parcel_hpc.testing.trainers import PROTECTED_PATH_ENV
from parcel_hpc.trainer import TrainingData
from parcel_hpc.trainer.numpy_mlp import NumpyMLP

REACH_DIR_ENV = "PARCEL_TEST_REACH_DIR"  # where the ways are taken in turn and what they got is written
REACH_AT_LAUNCH_ENV = "PARCEL_TEST_REACH_AT_LAUNCH"  # set: the launch's own import of the module reaches too
WAYS = ("import", "init", "dir_fd", "fork_exec", "program", "link", "reset")


def _active() -> Path | None:
    where = os.environ.get(REACH_DIR_ENV)
    return Path(where) if where and (os.environ.get("SUBMITIT_LOCAL_JOB_ID") or os.environ.get(REACH_AT_LAUNCH_ENV)) else None


def _take(folder: Path) -> int:
    """The next way's number, taken by creating its marker exclusively."""
    n = 0
    while True:
        try:
            os.close(os.open(folder / f"way-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return n
        except FileExistsError:
            n += 1


def _try(folder: Path, n: int, reach: Any) -> None:
    """Run ``reach`` (it returns bytes it read); write what it got, or the error it met, to ``seen-<n>``."""
    try:
        got = reach()
    except BaseException as exc:  # any refusal: the trainer swallows it and trains on, as a sly one would
        got = f"refused: {type(exc).__name__}: {exc}".encode()
    (folder / f"seen-{n}").write_bytes(got or b"")


def _protected() -> str:
    return os.environ[PROTECTED_PATH_ENV]


def _dir_fd() -> bytes:
    folder = os.open(os.path.dirname(_protected()), os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open(os.path.basename(_protected()), os.O_RDONLY, dir_fd=folder)
    return os.read(fd, 1 << 16)


def _fork_exec() -> bytes:
    import _posixsubprocess

    fork_exec: Any = _posixsubprocess.fork_exec  # what subprocess calls, without the audit event Popen raises
    read_end, write_end = os.pipe()
    cat = b"/bin/cat"
    argv = [cat, _protected().encode()]
    errpipe_read, errpipe_write = os.pipe()
    pid = fork_exec(
        argv,
        [cat],
        True,
        (write_end,),
        None,
        None,
        -1,
        -1,
        -1,
        write_end,
        -1,
        -1,
        errpipe_read,
        errpipe_write,
        False,
        False,
        -1,
        None,
        None,
        None,
        -1,
        None,
        False,
    )
    os.close(write_end)
    os.close(errpipe_write)
    os.waitpid(pid, 0)
    return os.read(read_end, 1 << 16)


def _reset() -> bytes:
    """Every piece of state a trainer could find in the fence's modules, emptied or switched off
    (and the old fence's switch, ``guard._FENCE.protected``), then a plain open."""
    try:
        __import__("parcel_hpc.worker.guard").worker.guard._FENCE.protected = None
    except (ImportError, AttributeError):
        pass
    off = {frozenset: frozenset(), str: "", tuple: (), int: 0, bool: False}
    for name in ("parcel_hpc.fence", "parcel_hpc.fence.arming", "parcel_hpc.fence.audit", "parcel_hpc.fence.kernel", "parcel_hpc.fence.protected"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attribute, value in list(vars(module).items()):
            if attribute.startswith("__"):
                continue
            if isinstance(value, (dict, list, set)):
                value.clear()
            elif type(value) in off:
                setattr(module, attribute, off[type(value)])
    return Path(_protected()).read_bytes()


def _program() -> bytes:
    return subprocess.run(["cat", _protected()], capture_output=True, check=False).stdout


def _link() -> bytes:
    other = Path(os.environ[REACH_DIR_ENV]) / "linked.json"
    os.link(_protected(), other)
    return other.read_bytes()


_REACHES = {"dir_fd": _dir_fd, "fork_exec": _fork_exec, "reset": _reset, "program": _program, "link": _link}

if (_where := _active()) is not None:
    _try(_where, _take(_where), lambda: Path(_protected()).read_bytes())  # way 0: the module's import


class ReachesPastTheFence(NumpyMLP):
    """The built-in model; in a worker, each instance tries the next way past the fence (``WAYS``)."""

    def __init__(self) -> None:
        super().__init__()
        self.way = ""
        folder = _active()
        if folder is not None:
            self.number = _take(folder)
            self.way = WAYS[self.number] if self.number < len(WAYS) else ""
            if self.way == "init":
                _try(folder, self.number, lambda: Path(_protected()).read_bytes())

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        folder = _active()
        if folder is not None and self.way in _REACHES:
            _try(folder, self.number, _REACHES[self.way])
