"""A search directory as its owner made it, and the processes that act for it held to it.

A team root is often writable by its group. Without the sticky bit, any member can rename a live
search away and put a copy of theirs (their pickles, their code) under its name, and every
process that opens ``<root>/<revision>`` by name afterwards (a queued job starting days later, a
worker importing the trainer's code) acts on the copy as the owner. So a search's identity is its
directory itself, ``Owned``: the uid that owns it, its inode and its search id (identity.json).
The launch takes it at its door (``identify``) and puts it into what it hands on: the command line
of every job (which the scheduler keeps, out of the root's reach) and of every selection job.

Every process that acts for the search then ``hold``s it before it unpickles, imports or writes
anything: the directory is opened once, judged through the open descriptor (fstat: owner, inode,
mode; identity.json read through it, never followed through a link), and from then on every path
inside the search resolves through that descriptor (``resolve``: ``/proc/self/fd/N/...``, the
kernel's name for the directory the descriptor holds), so a rename after the check cannot redirect
a single open. A directory that is not the search is refused in one line (``NotTheSearch``, exit 2)
and nothing is read from it. Paths recorded for other processes are written by name (``shown``).
Where ``/proc`` has no such names (not Linux: a laptop, never a shared root), paths stay names and
the check is by name. Commands a person runs (``release``, ``cancel``, ...) check at their door
and, before they write, again (``check``); they never run the search's code.

Why the inode and not the device too: NFS clients number a mount's device themselves, so a login
node and a compute node see one directory under two ``st_dev``; the inode is the server's file id.

Owns: Owned, identify, hold, enter, check, resolve, shown, and the small no-follow read of
identity.json through a held descriptor (``_read_in``). Must not: change a mode or an owner, or
write anything.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.errors import NotTheSearch, UsageError
from parcel_hpc.identity import IDENTITY_FILE, SearchIdentity
from parcel_hpc.ownership import OTHERS_WRITE, user_name

_FD_NAMES = Path("/proc/self/fd")
_MAX_IDENTITY_BYTES = 64 * 1024  # identity.json is a few hundred bytes
_HELD: dict[str, Path] = {}  # a held directory's name -> the path that reaches it through its descriptor
_NO_ID = "-"  # on a command line: a search frozen before ids


@dataclass(frozen=True)
class Owned:
    """A directory as its owner made it: what a process acting for it checks before anything else."""

    path: str  # the absolute name it was launched under
    uid: int  # who owns it: the only user that acts for it
    inode: int  # the directory itself: a copy, or another directory renamed into its place, has another
    search_id: str  # identity.json's id; "" for a search frozen before ids (or a folder that is no search)

    def argv(self) -> list[str]:
        """The four words a job's command line carries (``from_argv`` reads them back)."""
        return [self.path, str(self.uid), str(self.inode), self.search_id or _NO_ID]

    @classmethod
    def from_argv(cls, words: list[str]) -> Owned:
        path, uid, inode, search_id = words
        if not os.path.isabs(path) or not uid.isdigit() or not inode.isdigit():
            raise UsageError(f"{' '.join(words)} is not a search directory's identity (PATH UID INODE ID); the job was not submitted by parcel_hpc")
        return cls(path, int(uid), int(inode), "" if search_id == _NO_ID else search_id)


def identify(path: str | os.PathLike) -> Owned:
    """The directory at ``path`` as this process finds it now, refused (``NotTheSearch``, one line)
    unless it is this user's own and nobody else may write it: a launch's door, where what it finds
    becomes the identity every later process is held to."""
    name = os.path.abspath(path)
    fd = _open(name)
    try:
        st = os.fstat(fd)
        why = _not_own(st)
        if why:
            raise NotTheSearch(f"{name} {why}")
        return Owned(name, st.st_uid, st.st_ino, _search_id(fd, name))
    finally:
        os.close(fd)


def hold(owned: Owned) -> Path:
    """Open ``owned``'s directory, refuse it in one line (``NotTheSearch``) unless it is the one
    ``owned`` describes, and keep it open for this process's life: the path that reaches it through
    the descriptor (every later ``resolve`` of a path inside it goes there)."""
    if owned.path in _HELD:
        return _HELD[owned.path]
    fd = _open(owned.path)
    try:
        why = _differs(owned, os.fstat(fd), fd)
    except BaseException:
        os.close(fd)
        raise
    if why:
        os.close(fd)
        raise NotTheSearch(f"{owned.path} is not the search directory this process acts for: {why}; nothing was read from it or written to it")
    root = _FD_NAMES / str(fd)
    _HELD[owned.path] = root if root.is_dir() else Path(owned.path)  # no /proc names here: by name
    return _HELD[owned.path]


def enter(path: str | os.PathLike) -> Path:
    """The held path of the search at ``path``: the one this process holds already (a job's gate
    held it from its command line), else this user's own directory there now, held."""
    name = os.path.abspath(path)
    return _HELD[name] if name in _HELD else hold(identify(name))


def check(owned: Owned) -> None:
    """``NotTheSearch`` unless the directory at ``owned.path`` is still ``owned`` (a launch between
    two rounds, a command before it writes). By name: it holds nothing open."""
    fd = _open(owned.path)
    try:
        why = _differs(owned, os.fstat(fd), fd)
    finally:
        os.close(fd)
    if why:
        raise NotTheSearch(
            f"{owned.path} is no longer the search directory this process acts for: {why}; it stops here and writes nothing more "
            "(the search itself is wherever it was moved: move it back, or run the command on it where it is)"
        )


def resolve(path: str | os.PathLike) -> Path:
    """``path`` reached through the held directory it lies in (by name when it lies in none)."""
    name = os.path.abspath(path)
    for held, root in _HELD.items():
        if name == held:
            return root
        if name.startswith(held + os.sep):
            return root / name[len(held) + 1 :]
    return Path(path)


def shown(path: str | os.PathLike) -> str:
    """``path`` by its name, for what is recorded or printed for others (the inverse of ``resolve``)."""
    text = str(path)
    for held, root in _HELD.items():
        prefix = str(root)
        if text == prefix or text.startswith(prefix + os.sep):
            return held + text[len(prefix) :]
    return text


def _open(name: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotTheSearch(f"{name} does not exist: the search was moved or removed; nothing was read from it or written to it") from None
    except NotADirectoryError:
        raise NotTheSearch(f"{name} is not a directory; nothing was read from it or written to it") from None


def _not_own(st: os.stat_result) -> str:
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.getuid():
        return f"is owned by {user_name(st.st_uid)} (mode {mode:04o}), not by you ({user_name(os.getuid())}): only its owner acts for a search"
    if mode & OTHERS_WRITE:
        return f"is writable by its group or others (mode {mode:04o}): they could replace what the search trusts; run `chmod g-w,o-w` on it"
    return ""


def _differs(owned: Owned, st: os.stat_result, fd: int) -> str:
    """Why the directory open at ``fd`` (``st``) is not ``owned``; "" when it is."""
    if st.st_uid != owned.uid:
        return f"it is owned by {user_name(st.st_uid)} now, not by {user_name(owned.uid)}"
    if st.st_ino != owned.inode:
        return f"it is another directory now (inode {st.st_ino}, the search's is {owned.inode}): the search was moved away and this put in its place"
    if stat.S_IMODE(st.st_mode) & OTHERS_WRITE:
        return f"its group or others may write it now (mode {stat.S_IMODE(st.st_mode):04o})"
    found = _search_id(fd, owned.path)
    if found != owned.search_id:
        return f"its {IDENTITY_FILE} names search {found or 'none'}, not {owned.search_id or 'none'}"
    return ""


def _search_id(fd: int, name: str) -> str:
    raw = _read_in(fd, IDENTITY_FILE, name)
    if raw is None:
        return ""
    try:
        return SearchIdentity.from_json(json.loads(raw)).search_id
    except ValueError:
        raise NotTheSearch(f"{name}/{IDENTITY_FILE} is not JSON; it is damaged or planted: nothing was read from the search") from None


def _read_in(fd: int, file: str, name: str) -> bytes | None:
    """The regular file ``file`` in the directory open at ``fd``, never through a link, a FIFO or a
    device, at most ``_MAX_IDENTITY_BYTES``; None when there is none. (A small no-follow read of our
    own: fsio's readers take paths.)"""
    try:
        f = fsio.open_in(fd, file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotTheSearch(f"{name}/{file} is a symbolic link; a search's own records are regular files: nothing was read from it") from None
        raise
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_IDENTITY_BYTES:
            raise NotTheSearch(f"{name}/{file} is not a regular file of a record's size; nothing was read from the search")
        return os.read(f, _MAX_IDENTITY_BYTES + 1)
    finally:
        os.close(f)


# --- the command line every job of a dispatcher starts with (``worker.gate`` parses it) ----------

GATE_MODULE = "parcel_hpc.worker.gate"
SUBMITIT_ENTRY = ("-u", "-m", "submitit.core._submit")  # what submitit appends to its python, before the folder


def job_command(owned: Owned, python: str = sys.executable) -> str:
    """The interpreter command a dispatcher gives submitit for every job of the search ``owned``:
    the gate holds the search directory before submitit unpickles anything."""
    return " ".join([shlex.quote(python), "-P", "-u", "-m", GATE_MODULE, *map(shlex.quote, owned.argv())])
