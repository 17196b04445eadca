"""The fence's audit layer: Python's audit hook, judging what Python-level code opens and starts.

Every open Python reports (``open``, ``os.open``, an import's ``io.open_code``, ``np.load``,
``sqlite3.connect``, ``ctypes.CDLL``) is judged by the inode it reaches, so a symbolic link, a bind
mount, a rename or ``/proc/self/fd`` reaches the same verdict as the file's own path; reaching a
protected file, or a ``final-*.json`` made in the split's folder later, is refused with
``PermissionError`` and recorded ("opened <path>"). So is a hard link or a rename of a protected file.
An ``os.open`` relative to a folder descriptor (``dir_fd``: Python's event leaves the folder out) is
recorded when it names a protected file; where the kernel layer is not armed it is refused whatever it
names, since this layer cannot tell where it leads; the toolkit's own reads in a folder it holds name
the whole path once a process is fenced (``fsio.open_in``), so they are judged by the file they reach. A path-like object other than ``str``, ``bytes``
and pathlib's own is judged only by the kernel layer, and refused without it (its ``__fspath__`` may
answer the hook and the open differently).

Starting any program is refused and recorded: ``subprocess``, ``os.system``, ``os.exec*``,
``os.spawn*``, ``os.posix_spawn``, ``pty.spawn``, and ``_posixsubprocess.fork_exec`` itself (what
``multiprocessing``'s "spawn" and "forkserver" start with; Python reports nothing for it, so it is
wrapped here, and importing a fresh copy of it is refused). A program's own opens are out of this
layer's sight; under the kernel layer a program cannot read a protected file either, but a read the
kernel denies is told only to the kernel's audit log, which only root reads, so a program that reached
would go unrecorded: refusing programs keeps every reach recorded. The toolkit's own programs
(``scontrol`` on the scheduler's signal) run inside ``toolkit_programs``, in their thread only;
trainer code it calls back runs inside ``trainer_code`` again.

Once installed it judges for the rest of the process: there is no off switch. Its state lives in
closures, and the C functions it calls were taken when it was made, so assigning a module's attribute
(this package's, ``os``'s) changes nothing it does. It sees what Python reports and no more: a C
library opening a path itself (h5py given a path), ``ctypes``, and what trainer code does to this
process's own objects (reaching into closures, rewriting the toolkit's functions) are out of its
sight. Where the kernel layer is armed, none of those can read a protected file and only the record
is at stake; where it is not, this layer is the only fence, and that is its limit.

Must not: be installed in a process that must still read a protected file: it is one-way.
"""

from __future__ import annotations

import _thread
import pathlib
import posix
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from parcel_hpc.fence.protected import FINAL_PREFIX, FINAL_SUFFIX, Inode, Protected

# Audit events that start another program: it runs outside this process's hook.
PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "pty.spawn"})
_PATHLIB_TYPES = (pathlib.PurePath, pathlib.PurePosixPath, pathlib.Path, pathlib.PosixPath)


class _CannotJudge(Exception):
    """An open this layer cannot place (a folder descriptor, a path-like object of trainer code's)."""


def _make() -> tuple[Callable[[Protected, bool], None], Callable[[], tuple[str, ...]], Callable[[bool], Any]]:
    """The layer's three doors, sharing one closure: ``install``, ``tripped`` and ``window``.

    Everything the hook calls is bound here, builtins included, so that reassigning a module's
    attribute (``os.stat``, ``builtins.isinstance``, this module's constants) changes nothing it does.
    """
    stat, get_ident, add_hook = posix.stat, _thread.get_ident, sys.addaudithook
    str_: Any = str
    bytes_: Any = bytes
    type_: Any = type
    int_, list_, tuple_, isinstance_, len_ = int, list, tuple, isinstance, len
    permission_error, os_error, value_error, cannot_judge = PermissionError, OSError, ValueError, _CannotJudge
    encoding, errors, no_follow = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors(), posix.O_NOFOLLOW
    pathlib_types, pathlib_fspath = _PATHLIB_TYPES, pathlib.PurePath.__fspath__
    program_events, prefix, suffix, describe, shown = PROGRAM_EVENTS, FINAL_PREFIX, FINAL_SUFFIX, _program, _shown
    paths: dict[Inode, str] = {}  # protected inode -> its real path, for the record
    final_dirs: set[Inode] = set()  # folders every final-*.json in which is protected
    names: set[str] = set()  # the protected files' own names (final-group_r8.json, parcels.h5)
    trips: list[str] = []
    windows: dict[int, list[bool]] = {}  # thread -> stack of "programs allowed here"
    armed = {"on": False, "kernel": False}
    wrapped: dict[str, Any] = {}  # the fork_exec wrapper and the module it is in, to notice one restored

    def is_final(name: str) -> bool:
        return name.startswith(prefix) and name.endswith(suffix)

    def text_of(path: object) -> str:
        if isinstance_(path, str_):
            return str_.__add__("", path)  # a str subclass's own methods are never called
        if isinstance_(path, bytes_):
            return bytes_.__add__(b"", path).decode(encoding, errors)
        if type_(path) in pathlib_types and type_(path).__fspath__ is pathlib_fspath:
            return str_.__add__("", pathlib_fspath(path))
        raise cannot_judge(f"a path given as {type_(path).__name__}")

    def reached(text: str, dir_fd: int | None = None, follow: bool = True) -> str:
        """The protected file ``text`` reaches ("" when none)."""
        try:
            st = stat(text, dir_fd=dir_fd, follow_symlinks=follow)
            if (st.st_dev, st.st_ino) in paths:
                return paths[(st.st_dev, st.st_ino)]
        except (os_error, value_error):
            pass  # nothing there (a new file): only a final list made later can still be protected
        folder, _, name = text.rpartition("/")
        if is_final(name):
            try:
                st = stat(folder or ("/" if text.startswith("/") else "."), dir_fd=dir_fd)
                if (st.st_dev, st.st_ino) in final_dirs:
                    return text
            except (os_error, value_error):
                pass
        return ""

    def judge_open(path: object, os_open: bool, follow: bool = True) -> str:
        if isinstance_(path, int_):
            return ""  # an open descriptor: judged when it was opened
        text = text_of(path)
        found = reached(text, follow=follow)
        if found or not os_open or text.startswith("/"):
            return found and (f"opened {found}" if found == text else f"opened {found} (as {text})")
        # os.open with a relative path: Python's event leaves out the dir_fd it may be relative to.
        name = text.rpartition("/")[2]
        if name in names or is_final(name):
            return f"opened {text} relative to a folder descriptor"
        raise cannot_judge(f"os.open({text!r}) relative to a folder descriptor")

    def trip(what: str) -> None:
        trips.append(what)
        raise permission_error(
            f"trainer code {what}: the final partition's files are protected from trainer code, which gets its data from parcel_hpc.trainer.TrainingData"
        )

    def program(program_name: str) -> None:
        stack = windows.get(get_ident())
        if not stack or not stack[-1]:
            trip(f"started the program {program_name} (what a program opens is out of the fence's record)")

    def hook(event: str, args: tuple) -> None:
        if not armed["on"]:
            return
        try:
            if event == "open" and args:
                os_open = len_(args) > 1 and args[1] is None  # os.open's event: (path, None, flags)
                # O_NOFOLLOW: a link as the last name is refused by the open itself, so it reaches nothing.
                follow = not (os_open and len_(args) > 2 and isinstance_(args[2], int_) and args[2] & no_follow)
                found = judge_open(args[0], os_open=os_open, follow=follow)
            elif event in ("sqlite3.connect", "ctypes.dlopen") and args and isinstance_(args[0], (str_, bytes_)):
                found = judge_open(args[0], os_open=False) if "/" in text_of(args[0]) else ""
            elif event == "os.link" and len_(args) >= 3:
                found = reached(text_of(args[0]), args[2])
                found = found and f"made another name for {found}"
            elif event == "os.rename" and len_(args) >= 3:
                found = reached(text_of(args[0]), args[2], follow=False)
                found = found and f"moved {found}"
            elif event in program_events:
                program(describe(event, args))
                return
            elif event == "import" and args and args[0] == "_posixsubprocess":
                trip("imported a fresh _posixsubprocess (its fork_exec starts programs unreported)")
                return
            else:
                return
        except cannot_judge as exc:
            if armed["kernel"]:
                return  # the kernel judges the file it reaches
            raise permission_error(f"the fence cannot judge {exc} on this kernel (no Landlock); open it by its absolute path as a str") from None
        if found:
            trip(found)

    def wrap_fork_exec() -> None:
        """Report ``fork_exec`` like the calls Python reports, in the module and in subprocess's copy."""
        import _posixsubprocess
        import subprocess

        original = _posixsubprocess.fork_exec

        def fork_exec(*args: Any) -> Any:
            if armed["on"]:
                argv = args[0] if args and isinstance_(args[0], (list_, tuple_)) and args[0] else [b"?"]
                program(shown(argv[0]))
            return original(*args)

        _posixsubprocess.fork_exec = fork_exec
        if getattr(subprocess, "_fork_exec", None) is original:
            subprocess._fork_exec = fork_exec  # type: ignore[attr-defined]  # subprocess took its own reference at import
        wrapped.update(module=_posixsubprocess, fork_exec=fork_exec)

    def install(protected: Protected, kernel: bool) -> None:
        paths.update(zip(protected.inodes, protected.paths))
        final_dirs.add(protected.split_dir_inode)
        names.update(p.rpartition("/")[2] for p in protected.paths)
        if not armed["on"]:
            wrap_fork_exec()
            add_hook(hook)  # process-wide and permanent
            armed["on"] = True
        armed["kernel"] = armed["kernel"] or kernel  # a second arming only adds

    def tripped() -> tuple[str, ...]:
        restored = "reloaded _posixsubprocess (the fork_exec it restored starts programs unreported)"
        if armed["on"] and wrapped["module"].fork_exec is not wrapped["fork_exec"] and restored not in trips:
            trips.append(restored)
        return tuple_(trips)

    @contextmanager
    def window(programs: bool) -> Iterator[None]:
        stack = windows.setdefault(get_ident(), [])
        stack.append(programs)
        try:
            yield
        finally:
            stack.pop()

    return install, tripped, window


def _program(event: str, args: tuple) -> str:
    """The program an audit event starts, in one short line (the event's name when it names none)."""
    # subprocess.Popen: (executable, args, cwd, env), executable None unless given; os.spawn: (mode, path, ...).
    found = next((a for a in (args[1:2] if event == "os.spawn" else args[:2]) if a), None)
    if isinstance(found, (list, tuple)):
        found = found[0] if found else None
    return _shown(found) if isinstance(found, (str, bytes)) else event


def _shown(value: object) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return " ".join(text.split())[:200]


_install, tripped, _window = _make()


def reaches(asked_for: Iterable[str], since: int = 0) -> list[str]:
    """What trainer code did towards the protected data, in words: each partition it asked the loader
    for (``TrainingData.asked_for_final``), then each reach this layer recorded from number ``since`` on."""
    return [f"the trainer asked for {name}" for name in asked_for] + [f"trainer code {what}" for what in tripped()[since:]]


def install(protected: Protected, kernel: bool) -> None:
    """Judge every open and program start of this process from now on against ``protected`` (and
    whatever an earlier arming protected); ``kernel``: the kernel layer is armed too."""
    _install(protected, kernel)


@contextmanager
def toolkit_programs() -> Iterator[None]:
    """The toolkit's own programs, started in this thread while trainer code is fenced (submitit's
    ``scontrol requeue`` on the scheduler's signal): they are not the trainer's."""
    with _window(True):
        yield


@contextmanager
def trainer_code() -> Iterator[None]:
    """Trainer code the toolkit calls from inside ``toolkit_programs`` (its ``state()`` saved on the
    signal): programs are refused again."""
    with _window(False):
        yield
