"""Writes that stay whole on a shared filesystem (NFS included).

Owns the three primitives every record in a search directory is made with:
- ``atomic_write_*``: temp file in the same directory, fsync, rename, fsync the directory;
- ``create_exclusive``: O_CREAT|O_EXCL, which NFSv3+ implements atomically on the server
  (no flock, no SQLite: both are unreliable across NFS clients);
- ``append_jsonl`` / ``read_jsonl``: one writer per file, one ``write()`` per record, fsync; the
  reader tolerates a torn last line (a writer killed mid-append) and refuses a torn middle line.

And the one way a file the user names (``export -o``, ``reconcile --html``) is written:
``write_output``, temp + rename over a regular file or nothing (never a device, FIFO, directory or
symlink: root must never replace /dev/full), every failure one line.

Nothing the toolkit creates is writable by anyone but its owner, whatever the umask (a group umask
0002 in a setgid team directory included): files 0o644 (or tighter), directories 0o755. Others may
read (admins read other people's searches); a group member who could write could replace a pickle
a queued job unpickles, and run code as the owner.

Every record is read through ``read_bytes`` (``read_json``, ``read_jsonl`` and ``Folder`` too),
because a shared root holds other users' files: only a regular file, judged on the opened
descriptor (never checked by path, then opened), never a FIFO or a device (opened non-blocking, so
a FIFO cannot hang the reader), at most ``MAX_RECORD_BYTES``, and a JSONL line at most
``MAX_LINE_BYTES``, read in chunks that stop at the first line over it. A record of a search is
read ``within`` its search directory: every component below it is opened by name from its folder's
descriptor without following a link (``Folder``), so a linked trial folder, a linked sub-folder of
a record folder and a linked record are all refused, never followed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from parcel_hpc.errors import CorruptRecord, ParcelError, UsageError

FILE_MODE = 0o644
DIR_MODE = 0o755
# A record file, and one line of a journal. A 10,000-trial search's largest record (a launch's
# summary naming every trial) is a few MB and a journal line (an ending with its traceback) a few
# kB; anything past these is damaged or hostile, and reading it would cost its size in memory.
MAX_RECORD_BYTES = 64 * 2**20
MAX_LINE_BYTES = 4 * 2**20
_CHUNK = 2**20


def owner_only_writes() -> None:
    """Drop 'group or others may write' from this process's umask, for the files libraries create
    for us with their own modes: submitit's folder, pickles and submission scripts, HDF5 files, and
    what the scheduler writes for jobs submitted from here (sbatch passes its umask on to the job)."""
    os.umask(os.umask(0) | 0o022)


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, ASCII: equal values give byte-equal text on every host."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def ensure_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` and missing parents as 0o755 whatever the umask (mkdir's mode is masked, and
    ``parents=True`` ignores it for the parents)."""
    p = Path(path)
    missing = []
    probe = p
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # another process made it first: the search's door checks whose it is
        os.chmod(d, DIR_MODE)
    if not p.is_dir():
        raise UsageError(f"{p} exists and is not a directory; choose another path")
    return p


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _durable_temp(path: Path, data: bytes, mode: int, suffix: str) -> str:
    """``data`` in a new temp file beside ``path``, fsynced, with its final mode. A failure (a full
    disk) leaves no temp file and names ``path``, the file that could not be written."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    except OSError as exc:
        raise _naming(exc, path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException as exc:
        _unlink_quietly(tmp)
        if isinstance(exc, OSError):
            raise _naming(exc, path) from None
        raise
    return tmp


def _naming(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` as the same kind of error, naming ``path`` (a write's error names no file)."""
    return type(exc)(exc.errno, exc.strerror, str(path))


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = FILE_MODE) -> None:
    path = Path(path)
    tmp = _durable_temp(path, data, mode, ".tmp")
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = FILE_MODE) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: str | os.PathLike, obj: Any, mode: int = FILE_MODE) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n", mode)


_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_output(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as an output file the user named with ``flag``: absent or a regular file, in an
    existing folder. Called before the work, so a wrong path costs nothing; UsageError otherwise."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a folder on the way we may not search, a name too long
        raise UsageError(f"{flag} {path}: cannot be checked ({exc.strerror}); give a file path in a folder you can write") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{flag} {path} is a symbolic link (to {os.readlink(path)}); give the path of the file itself")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), "not a regular file")
        raise UsageError(f"{flag} {path} is {kind}, not a regular file, and is never replaced; give a file path")
    if not path.absolute().parent.is_dir():
        raise UsageError(f"{flag} {path}: its folder does not exist; give a file path in an existing folder")
    return path


def write_output(path: str | os.PathLike, data: bytes, flag: str) -> None:
    """``data`` into the output file ``path`` (``check_output``'s rules), whole or not at all."""
    path = check_output(path, flag)
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:  # an unwritable folder, a read-only or full filesystem
        raise UsageError(f"{flag} {path}: cannot be written ({exc.strerror}); give a file path in a folder you can write") from None


def create_exclusive(path: str | os.PathLike, data: bytes, mode: int = FILE_MODE) -> bool:
    """Create ``path`` holding ``data`` only if it does not exist; False if someone else has it.

    The content is written to a temp file first and then hard-linked into place: ``link`` fails
    with EEXIST atomically (also on NFS), and a reader never sees a half-written claim.
    """
    path = Path(path)
    tmp = _durable_temp(path, data, mode, ".claim")
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        _unlink_quietly(tmp)
    fsync_dir(path.parent)
    return True


def create_exclusive_json(path: str | os.PathLike, obj: Any, mode: int = FILE_MODE) -> bool:
    return create_exclusive(path, (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode(), mode)


def read_bytes(
    path: str | os.PathLike,
    limit: int = MAX_RECORD_BYTES,
    line_limit: int | None = None,
    within: str | os.PathLike | None = None,
    named: str | None = None,
) -> bytes:
    """The whole of the regular file ``path`` (see the module docstring); CorruptRecord naming the
    file for anything else. ``line_limit``: also refuse a line longer than it, found while reading.
    ``within``: a folder above ``path`` (the search directory) below which no component of the path
    may be a symbolic link (``Folder``). ``named``: ``path`` is a file the user named (a split file),
    which a link may stand for; a refusal of it is bad input (UsageError) and says ``named``, what
    to give instead, never to move or remove a file that may not be the user's (/etc/passwd)."""
    path = Path(path)
    if within is not None:
        with Folder.open(path.parent, within=within, listed=False) as folder:
            return folder.read_bytes(path.name, limit, line_limit)
    try:
        fd = os.open(path, _FILE if named is None else _FILE & ~os.O_NOFOLLOW)
    except OSError as exc:
        raise _refused(exc, str(path)) from None
    try:
        return _read_regular(fd, os.path.dirname(path), os.path.basename(path), limit, line_limit, named)
    finally:
        os.close(fd)


# How a search's files and folders are opened: by name relative to their folder's descriptor
# (openat), never through a symbolic link (O_NOFOLLOW), a file never blocking (a FIFO opens at once,
# and is then refused as no regular file). A folder the walk only passes through is opened O_PATH
# (no read permission needed, as a path lookup needs none).
_FILE = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_LISTED = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PASSED = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_whole_names = False  # open_in's way, set for good by whole_names()


def whole_names() -> None:
    """From now on ``open_in`` opens ``/proc/self/fd/N/NAME``, never ``NAME`` relative to the folder
    descriptor N. Called when a process is fenced (``fence.arming``): the fence's audit layer judges
    an open by the path it is shown, and Python's event for an open relative to a descriptor leaves
    the descriptor out, so it could not tell the toolkit's own ``final-plan.json`` in the search from
    the protected final list. The two opens reach the same file with the same no-follow rule."""
    global _whole_names
    _whole_names = True


def open_in(dir_fd: int, name: str, flags: int) -> int:
    """``os.open`` of the single name ``name`` in the folder open at ``dir_fd``."""
    if _whole_names:
        return os.open(f"/proc/self/fd/{dir_fd}/{name}", flags)
    return os.open(name, flags, dir_fd=dir_fd)


class Folder:
    """A folder of a search, open: every file and folder below it is opened by name from its
    descriptor, one component at a time, never through a symbolic link, never ``..``. A link
    anywhere below the folder a walk started from (a record, a trial's folder, a sub-folder of
    one) is refused in one line, not followed; the folder itself is found as the user named it.

    Opened once for many reads (a trial's spec and journals), it also spares the kernel a lookup
    of the whole path per file. Use it as a context manager: it holds a descriptor."""

    def __init__(self, fd: int, where: str) -> None:
        self.fd = fd
        self.where = where  # its path, for messages only: every open goes through ``fd``

    def name_of(self, name: str) -> str:
        """The path of ``name`` in this folder, for a message."""
        return os.path.join(self.where, name)

    @classmethod
    def open(cls, path: str | os.PathLike, within: str | os.PathLike | None = None, listed: bool = True) -> Folder:
        """The folder ``path``. ``within``: a folder above it (the search directory, found as
        named) from which every component down to ``path`` is walked without following a link.
        ``listed=False``: opened only to open what is in it (``entries`` then fails), which, as a
        path lookup, needs no permission to read the folder."""
        path = Path(path)
        if within is None:
            try:
                return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), str(path))
            except OSError as exc:
                raise _refused(exc, str(path)) from None
        root = Path(within)
        try:
            parts = path.relative_to(root).parts
        except ValueError:  # a name from a record (a job id) that leads out
            raise CorruptRecord(f"{path} is outside {root}, and records are read only from inside it; restore the record that names it") from None
        try:
            fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise _refused(exc, str(root)) from None
        where = str(root)
        try:
            last = _LISTED if listed else _PASSED
            for i, part in enumerate(parts):
                step = _at(fd, part, last if i == len(parts) - 1 else _PASSED, where)
                os.close(fd)
                fd, where = step, os.path.join(where, part)
            if not parts and listed:  # the root itself, to be listed
                step = open_in(fd, ".", _LISTED)
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, str(path))

    def folder(self, name: str) -> Folder:
        """The folder ``name`` in this one, never through a link."""
        return Folder(_at(self.fd, name, _LISTED, self.where), self.name_of(name))

    def read_bytes(self, name: str, limit: int = MAX_RECORD_BYTES, line_limit: int | None = None) -> bytes:
        """The whole of the regular file ``name`` in this folder (``read_bytes``'s rules)."""
        fd = _at(self.fd, name, _FILE, self.where)
        try:
            return _read_regular(fd, self.where, name, limit, line_limit)
        finally:
            os.close(fd)

    def read_json(self, name: str) -> Any:
        return _parse_json(self.read_bytes(name), self.name_of(name))

    def read_jsonl(self, name: str) -> list[Any]:
        """``read_jsonl`` of the file ``name`` in this folder."""
        try:
            data = self.read_bytes(name, line_limit=MAX_LINE_BYTES)
        except FileNotFoundError:
            return []
        return parse_jsonl(data, self.name_of(name))

    def read_tail(self, name: str, size: int) -> tuple[bytes, int]:
        """The last ``size`` bytes at most of the regular file ``name`` (a log), and its whole size."""
        fd = _at(self.fd, name, _FILE, self.where)
        try:
            whole = _regular(fd, self.name_of(name)).st_size
            start, chunks, got = max(0, whole - size), [], 0
            while got < size and (chunk := os.pread(fd, min(_CHUNK, size - got), start + got)):
                chunks.append(chunk)
                got += len(chunk)
            return b"".join(chunks), whole
        finally:
            os.close(fd)

    def entries(self) -> list[os.DirEntry[str]]:
        """What this folder holds. An entry's ``path`` is its name alone, and its ``stat`` and
        ``is_dir`` may ask this folder's descriptor: use them before the folder is closed."""
        with os.scandir(self.fd) as found:
            return list(found)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def names(path: str | os.PathLike, within: str | os.PathLike) -> list[str]:
    """The names in the folder ``path`` below ``within`` (``Folder``'s walk); [] when it is absent."""
    try:
        with Folder.open(path, within=within) as folder:
            return [e.name for e in folder.entries()]
    except FileNotFoundError:
        return []


def _at(dir_fd: int, name: str, flags: int, where: str) -> int:
    """Open ``name`` in the folder ``dir_fd`` (at ``where``) with ``flags``; a refusal names the path."""
    if name in ("", ".", "..") or "/" in name:
        raise CorruptRecord(f"{os.path.join(where, name)}: {name!r} names no file inside the search; a record names only its own files: restore it")
    try:
        return open_in(dir_fd, name, flags)
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:  # O_DIRECTORY met a link or a file: say which
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            if link:
                exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        raise _refused(exc, os.path.join(where, name)) from None


def _refused(exc: OSError, path: str) -> Exception:
    """What an open of ``path`` that failed with ``exc`` raises: a symbolic link, a file where a
    folder belongs and the like are damage (CorruptRecord); an absent file and a permission stay
    what they are, naming the whole path (callers tell absent records apart, and a permission is
    its own one line)."""
    if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
        return CorruptRecord(f"{path} is a symbolic link, and records are read only from regular files inside the search; remove the link")
    if exc.errno == errno.ENOTDIR:
        return CorruptRecord(f"{path} is not a folder, and a search's records sit in folders of their own; move it out of the search")
    return type(exc)(exc.errno, exc.strerror, path)


def _damaged(problem: str, advice: str, named: str | None) -> ParcelError:
    """A file that is not what it should be: a record (CorruptRecord, with ``advice`` to its owner),
    or a file the user ``named`` (UsageError, saying what to give instead)."""
    return UsageError(f"{problem}; {named}") if named is not None else CorruptRecord(f"{problem}; {advice}")


def _regular(fd: int, path: str, named: str | None = None) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), "not a regular file")
        raise _damaged(f"{path} is not a regular file ({kind})", "records are never read from one: remove it", named)
    return st


def _read_regular(fd: int, where: str, name: str, limit: int, line_limit: int | None, named: str | None = None) -> bytes:
    """The regular file open as ``fd`` (``name`` in the folder ``where``), read whole within the limits."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        _regular(fd, os.path.join(where, name), named)  # raises, naming what it is
    if st.st_size > limit:
        raise _damaged(f"{os.path.join(where, name)} is {st.st_size} bytes, over the {limit}-byte limit of a record file", _NOT_A_RECORD, named)
    return _read_bounded(fd, where, name, limit, line_limit, named)


_NOT_A_RECORD = "it is damaged or not a record: move it aside"


def _read_bounded(fd: int, where: str, name: str, limit: int, line_limit: int | None, named: str | None) -> bytes:
    """Read in chunks (the file may grow after fstat): stop at ``limit`` or at a line over ``line_limit``."""
    chunks: list[bytes] = []
    size = line = 0  # bytes read; bytes since the last newline
    while chunk := os.read(fd, _CHUNK):
        size += len(chunk)
        if size > limit:
            raise _damaged(f"{os.path.join(where, name)} is over the {limit}-byte limit of a record file", _NOT_A_RECORD, named)
        if line_limit is not None:
            lengths = [len(part) for part in chunk.split(b"\n")]
            lengths[0] += line  # the line the last chunk left open goes on
            if max(lengths) > line_limit:
                raise _damaged(
                    f"{os.path.join(where, name)} has a line over the {line_limit}-byte limit of a journal line", "it is damaged: move the file aside", named
                )
            line = lengths[-1]
        chunks.append(chunk)
    return b"".join(chunks)


def read_json(path: str | os.PathLike, within: str | os.PathLike | None = None, named: str | None = None) -> Any:
    """``read_bytes`` (its ``within`` and ``named``) of a JSON file, parsed."""
    return _parse_json(read_bytes(path, within=within, named=named), path, named)


def _parse_json(data: bytes, path: str | os.PathLike, named: str | None = None) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise _damaged(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})", "move it aside and rerun", named) from None
    except UnicodeDecodeError:
        raise _damaged(f"{path} is not UTF-8 text, so not JSON", "move it aside and rerun", named) from None
    except RecursionError:
        raise _damaged(f"{path} nests too deep to be a record", "move it aside and rerun", named) from None


def append_jsonl(path: str | os.PathLike, record: dict, fsync: bool = True) -> None:
    """Append one record as one line. The file must have a single writer (one per attempt)."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        _repair_torn_tail(fd)
        size = os.fstat(fd).st_size
        try:
            rest = memoryview(line)
            while rest:  # one write; a full disk takes what fits of it, and says so at the next
                rest = rest[os.write(fd, rest) :]
            if fsync:
                os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # no torn line left behind
            raise _naming(exc, path) from None
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike, within: str | os.PathLike | None = None) -> list[dict]:
    """All whole records; a torn last line (no newline, or not JSON) is skipped."""
    try:
        data = read_bytes(path, line_limit=MAX_LINE_BYTES, within=within)
    except FileNotFoundError:
        return []
    return parse_jsonl(data, str(path))


def parse_jsonl(data: bytes, name: str = "<jsonl>") -> list[Any]:
    body = data[: data.rfind(b"\n") + 1]  # a last line without its newline is torn: never a record
    if body and not body.startswith(b"\n") and b"\n\n" not in body:
        try:
            # One parse of every whole line, the usual file; anything else is read line by line.
            records = json.loads(b"[" + body[:-1].replace(b"\n", b",") + b"]")
            if len(records) == body.count(b"\n"):
                return records
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            pass
    return list(_parse_lines(data, name))


def _parse_lines(data: bytes, name: str) -> Iterable[Any]:
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            if i == last or (i == last - 1 and not lines[last].strip()):
                return  # torn tail from a killed writer
            raise CorruptRecord(f"{name} line {i + 1} is not valid JSON; the record is damaged mid-file: move the file aside") from None
        if i == last:
            return  # whole JSON but no trailing newline: the writer died before finishing the line
        yield rec


def _repair_torn_tail(fd: int) -> None:
    """Cut a torn last line left by a writer that died mid-append (this file's writer was us)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    data = os.pread(fd, size, 0)  # journals are small (one trial, one writer)
    os.ftruncate(fd, data.rfind(b"\n") + 1)


def _unlink_quietly(path: str | os.PathLike) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
