"""The fence's kernel layer: Landlock, enforced by the kernel on the arming thread and on every
thread, child process and program started from it after, for good.

Landlock rules only allow. To keep a few files from a process and leave everything else as it was,
the ruleset handles every filesystem right the kernel knows and allows, along each name of each
protected file: listing (and nothing else) on every folder from the file's own up to ``/``, and
every right on each other entry of those folders. A protected file then has no right at all: it
cannot be read, written, truncated, executed, renamed, removed or linked (Landlock refuses a link or
a rename that would give a file rights it lacks). It holds for C libraries, ``ctypes``, descriptors
opened relative to a folder (``dir_fd``), ``/proc/self/fd`` links and programs alike, because the
kernel judges the file each open reaches, whatever path or call led there.

A name is the file's path through every mount that shows its filesystem's folder (a bind mount of
the data folder is a second way in), from ``/proc/self/mountinfo``; a second hard link is not a
name: ``protected.py`` refuses a file that has one.

What it costs the fenced process: a folder on the path to a protected file takes no new entry it
could use (a file made there after arming has no rights; keep the data folder out of folders trainer
code writes into directly, such as ``/tmp`` or ``$HOME``); setuid programs run without their
privileges (``no_new_privs``, which Landlock requires); a thread that was already running when the
process armed (a C library's pool, started at import) is outside it.

Must not: decide what is protected (``protected.py``), or be relied on where ``abi()`` is below
``MIN_ABI``: the audit layer stands alone there.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from parcel_hpc.fence.protected import Inode, Protected, inode_of

# The syscalls' numbers are the same on every architecture Linux added them to after 5.1.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

MIN_ABI = 2  # ABI 1 (Linux 5.13 to 5.18) refuses every rename between folders, which the worker's own writes need
READ_DIR = 1 << 3
# Rights that apply to a file (any other right on a non-folder rule is EINVAL): execute, write, read, truncate, ioctl.
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)
_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}  # ABI 5 and later: (1 << 16) - 1


class KernelUnavailable(Exception):
    """The kernel layer cannot be armed here; the message says why, for the record."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi() -> int:
    """The Landlock ABI this kernel offers (0: none, or turned off)."""
    found = _libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(found))


def rights(version: int) -> int:
    """Every filesystem right Landlock ABI ``version`` knows."""
    return _RIGHTS_BY_ABI.get(version, (1 << 16) - 1)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: which filesystem (``device``), which of its folders (``root``), and where."""

    device: str  # major:minor
    root: str
    mount_point: str


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5:
            mounts.append(Mount(fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _within(path: str, top: str) -> str | None:
    """``path`` below ``top`` ("" for ``top`` itself), or None when it is not below it."""
    if top == "/":
        return path.lstrip("/")
    if path == top:
        return ""
    return path[len(top) + 1 :] if path.startswith(top + "/") else None


def names(path: str, mounts: Sequence[Mount]) -> list[str]:
    """Every path that shows the file at real path ``path``: through the mount that holds it and
    through every other mount of the same filesystem whose folder contains it (pure)."""
    held = [(m, rest) for m in mounts if (rest := _within(path, m.mount_point)) is not None]
    if not held:
        return [path]
    mount, rest = max(held, key=lambda found: len(found[0].mount_point))  # the innermost mount holds it
    inside = os.path.join(mount.root, rest) if rest else mount.root
    found = [path]
    for other in mounts:
        if other.device == mount.device and (below := _within(inside, other.root)) is not None:
            shown = os.path.join(other.mount_point, below) if below else other.mount_point
            if shown not in found:
                found.append(shown)
    return found


@dataclass(frozen=True)
class Rule:
    path: str
    access: int


def rules(paths: Iterable[str], protected: Collection[Inode], handled: int) -> list[Rule]:
    """Listing on each folder on the way to each path (a path ending in "/": to the folder itself),
    every right on everything beside that way.
    ``KernelUnavailable`` when a folder on the way cannot be listed (its other entries could not be
    allowed, so the fence would take them from the process)."""
    chains = [_folders_above(p) for p in paths]
    on_the_way = {inode for chain in chains for _, inode in chain}
    out: list[Rule] = []
    done: set[Inode] = set()
    for folder, inode in (step for chain in chains for step in chain):
        if inode in done:
            continue
        done.add(inode)
        out.append(Rule(folder, READ_DIR))
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            raise KernelUnavailable(f"{folder} cannot be listed ({exc.strerror}), so the fence could not leave its other entries alone") from None
        for entry in entries:
            try:
                st = os.stat(entry.path)  # through a mount point: the mounted folder, which the rule binds to
            except OSError:
                continue  # gone, or not ours to reach: no rule, no access (as before)
            if entry.is_symlink() or inode_of(st) in on_the_way or inode_of(st) in protected:
                continue  # a link's target is judged where it lies; the way and the protected files get no more
            out.append(Rule(entry.path, handled if stat.S_ISDIR(st.st_mode) else handled & _FILE_RIGHTS))
    return out


def _folders_above(path: str) -> list[tuple[str, Inode]]:
    """The folders from ``path``'s own up to ``/``, each with its inode."""
    out = []
    folder = os.path.dirname(path)
    while True:
        out.append((folder, inode_of(os.stat(folder))))
        if folder == "/":
            return out
        folder = os.path.dirname(folder)


def restrict(protected: Protected) -> str:
    """Arm the kernel layer on this thread (and all it starts) for ``protected``; what it holds, in
    words. ``KernelUnavailable`` (nothing armed) where this kernel or these folders do not allow it."""
    version = abi()
    if version < MIN_ABI:
        raise KernelUnavailable(
            "this kernel has no Landlock" if version == 0 else f"this kernel's Landlock is ABI {version}; the kernel fence needs ABI {MIN_ABI} (Linux 5.19)"
        )
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        mounts = []
    paths = [name for path in protected.paths if os.path.exists(path) for name in names(path, mounts) if os.path.exists(name)]
    handled = rights(version)
    chosen = rules([*paths, os.path.join(protected.split_dir, "")], frozenset(protected.inodes), handled)  # the split's folder too: lists made there later
    ruleset = _check(_libc.syscall(_CREATE_RULESET, ctypes.byref(_RulesetAttr(handled)), ctypes.c_size_t(ctypes.sizeof(_RulesetAttr)), ctypes.c_uint32(0)))
    try:
        for rule in chosen:
            _add(ruleset, rule)
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        _check(_libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)))
    finally:
        os.close(ruleset)
    others = len(os.listdir("/proc/self/task")) - 1
    return f"Landlock ABI {version}, {len(chosen)} rules" + (f"; {others} threads started before it are outside it" if others > 0 else "")


def _add(ruleset: int, rule: Rule) -> None:
    try:
        fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone since it was listed: nothing to allow
    try:
        _check(
            _libc.syscall(
                _ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(_PathBeneathAttr(rule.access, fd)), ctypes.c_uint32(0)
            )
        )
    finally:
        os.close(fd)


def _check(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise KernelUnavailable(f"Landlock refused ({os.strerror(errno)})")
    return result
