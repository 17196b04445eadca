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
trainer code it calls back runs inside ``trainer_code`` again. Under the kernel layer, and there
only, torch.compile's own programs (its C++ compiler, ``openssl``, its ISA probe) start when
``compiler.py`` judges the start theirs, found at the first arming; each is recorded (``allowed``),
and runs the file and environment judged. Without Landlock they are refused like any program, saying
why (what they open would go unseen).

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
import os
import pathlib
import posix
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from parcel_hpc.fence.compiler import Compilers, Judge, Verdict, judge_of
from parcel_hpc.fence.protected import FINAL_PREFIX, FINAL_SUFFIX, Inode, Protected

# Audit events that start another program: it runs outside this process's hook.
PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "pty.spawn"})
_PATHLIB_TYPES = (pathlib.PurePath, pathlib.PurePosixPath, pathlib.Path, pathlib.PosixPath)


class _CannotJudge(Exception):
    """An open this layer cannot place (a folder descriptor, a path-like object of trainer code's)."""


Start = tuple[list[str], list[str], dict[str, str], "str | None"]  # argv, the files execve tries, the environment, cwd


def _make() -> tuple[Callable[[Protected, bool], None], Callable[[], tuple[str, ...]], Callable[[bool], Any], Callable[[], tuple[str, ...]]]:
    """The layer's four doors, sharing one closure: ``install``, ``tripped``, ``window`` and ``allowed``.

    Everything the hook calls is bound here, builtins included, so that reassigning a module's
    attribute (``os.stat``, ``builtins.isinstance``, this module's constants) changes nothing it does.
    """
    stat, get_ident, add_hook = posix.stat, _thread.get_ident, sys.addaudithook
    str_: Any = str
    bytes_: Any = bytes
    type_: Any = type
    int_, list_, tuple_, isinstance_, len_, callable_, any_ = int, list, tuple, isinstance, len, callable, any
    permission_error, os_error, value_error, cannot_judge = PermissionError, OSError, ValueError, _CannotJudge
    type_error, index_error = TypeError, IndexError
    encoding, errors, no_follow = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors(), posix.O_NOFOLLOW
    pathlib_types, pathlib_fspath = _PATHLIB_TYPES, pathlib.PurePath.__fspath__
    program_events, prefix, suffix, describe, shown = PROGRAM_EVENTS, FINAL_PREFIX, FINAL_SUFFIX, _program, _shown
    paths: dict[Inode, str] = {}  # protected inode -> its real path, for the record
    final_dirs: set[Inode] = set()  # folders every final-*.json in which is protected
    names: set[str] = set()  # the protected files' own names (final-group_r8.json, parcels.h5)
    trips: list[str] = []
    allowed: list[str] = []  # the compiler's programs started under the kernel layer, one entry a start
    judges: list[Judge] = []  # torch.compile's programs, as found at the first arming
    environ, defpath, dict_ = os.environ, os.defpath, dict
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

    def encode(text: str) -> bytes:
        return str_.encode(text, encoding, errors)

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

    def env_of(given: Any) -> dict[str, str]:
        """The environment a start gets: a mapping (Popen's), ``K=V`` items (fork_exec's), or None: this process's."""
        if given is None:
            return dict_(environ)
        if isinstance_(given, (list_, tuple_)):
            return {k: v for k, _, v in (text_of(item).partition("=") for item in given)}
        return {text_of(k): text_of(v) for k, v in given.items()}

    def placed(text: str, cwd: str | None) -> str:
        return text if text.startswith("/") or cwd is None else cwd + "/" + text

    def popen_start(args: tuple) -> Start:
        """subprocess.Popen's event: (executable, args, cwd, env); the files it will try, as subprocess finds them."""
        executable, given, cwd_raw, env_raw = args[:4]
        argv = [text_of(a) for a in ((given,) if isinstance_(given, (str_, bytes_)) else given)]
        cwd, env = (None if cwd_raw is None else text_of(cwd_raw)), env_of(env_raw)
        exe = text_of(executable) if executable is not None else argv[0]
        if "/" in exe:
            return argv, [placed(exe, cwd)], env, cwd
        return argv, [placed((folder or ".") + "/" + exe, cwd) for folder in env.get("PATH", defpath).split(":")], env, cwd

    def fork_exec_start(args: tuple) -> Start:
        """_posixsubprocess.fork_exec's (argv, executable_list, close_fds, pass_fds, cwd, env_list, ...)."""
        cwd = None if args[4] is None else text_of(args[4])
        return [text_of(a) for a in args[0]], [placed(text_of(c), cwd) for c in args[1]], env_of(args[5]), cwd

    def program(program_name: str, start_of: Callable[[], Start] | None = None, runs: bool = False) -> tuple[Verdict, Start] | None:
        """Refuse and record a program's start, unless the toolkit starts it or it is one of
        torch.compile's under the kernel layer: then that start, judged (``compiler.py``), and
        recorded where it ``runs`` (fork_exec, after subprocess's own event)."""
        stack = windows.get(get_ident())
        if stack and stack[-1]:
            return None
        if start_of is not None and judges:
            try:
                start = start_of()
                found = judges[0](*start)
            except (cannot_judge, os_error, value_error, type_error, index_error):
                found = None  # a start this layer cannot read is no compiler's: refused below
            if found is not None and found.problem == "":
                if armed["kernel"]:
                    if runs:
                        allowed.append(found.name)
                    return found, start
                trip(
                    f"started the program {found.path} for torch.compile, which only a kernel with Landlock lets a fenced process start "
                    "(what it opens would go unseen here): run on a kernel with Landlock ABI 2, or without torch.compile"
                )
            if found is not None and found.problem is not None:
                trip(f"started the program {found.path}, one of torch.compile's, in a way the fence refuses: {found.problem}")
        trip(f"started the program {program_name} (what a program opens is out of the fence's record)")
        return None

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
                program(describe(event, args), (lambda: popen_start(args)) if event == "subprocess.Popen" else None)
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
                # A preexec_fn is Python run in the child before its exec, where this process's record cannot see it: never judged a compiler's.
                judgeable = len_(args) > 5 and not any_(callable_(a) for a in args[6:])
                judged = program(shown(argv[0]), (lambda: fork_exec_start(args)) if judgeable else None, runs=True)
                if judged is not None:
                    # One of torch.compile's: it runs the very file judged, named by it (gcc finds its own programs from
                    # argv[0], Python its prefix), with the very environment judged.
                    found, (_, _, env, _) = judged
                    run_argv = (encode(found.path), *args[0][1:])
                    run_env = [encode(f"{k}={v}") for k, v in found.environment(env).items()]
                    args = (run_argv, (encode(found.path),), *args[2:5], run_env, *args[6:])
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
            judges.append(judge_of(Compilers.here(environ), lambda text: reached(text)))  # before any trainer code can change PATH or CXX
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

    def programs_allowed() -> tuple[str, ...]:
        return tuple_(allowed)

    return install, tripped, window, programs_allowed


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


_install, tripped, _window, allowed = _make()


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
