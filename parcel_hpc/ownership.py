"""Who this process is, and whether a search directory is its own to write in.

Searches share roots with other users' searches (a team root is often group-writable, setgid
2775). What a search writes is executed or trusted later (submitit's pickles, the contract, the
journals), so a search directory must be this user's alone: owned by this uid and writable by
nobody else (``fsio.owner_only_writes`` keeps everything created inside it that way). A search
directory that is not is refused before anything is written in it. The root itself is the
team's, and is not checked.

Owns: ``current_user`` (the process's own uid, never ``$LOGNAME``/``$USER``, which anyone sets)
and ``require_own_search``. Must not change a mode or an owner: the fix is the user's to run.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc.errors import UsageError

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def user_name(uid: int) -> str:
    """The account name of ``uid``; the number itself where the password database has none (a
    container without the user's entry)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def current_user() -> str:
    """Who runs this process: recorded as who launched, cancelled or selected."""
    return user_name(os.getuid())


@dataclass(frozen=True)
class Trespass:
    """A path in a search directory that someone other than this user owns or may write."""

    path: Path
    uid: int
    mode: int  # st_mode's permission bits

    @property
    def foreign(self) -> bool:
        return self.uid != os.getuid()


def trespass(top: Path) -> Trespass | None:
    """The first path under ``top`` (``top`` included) owned by another uid, or a file or directory
    its group or others may write; None when the whole tree is this user's alone. Symlinks are
    judged by their owner (their own mode is always 0777) and, below ``top``, never followed; a
    ``top`` that is a link is judged, then the directory it names."""
    for path, st in _tree(top):
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.getuid() or (not stat.S_ISLNK(st.st_mode) and mode & OTHERS_WRITE):
            return Trespass(path, st.st_uid, mode)
    return None


def _tree(top: Path) -> Iterator[tuple[Path, os.stat_result]]:
    yield top, top.lstat()
    if top.is_symlink():
        top = top.resolve()
        yield top, top.lstat()
    pending = [top] if top.is_dir() else []
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                yield Path(entry.path), st
                if stat.S_ISDIR(st.st_mode):
                    pending.append(Path(entry.path))


def require_own_search(search_dir: Path, *, launch: bool) -> None:
    """Refuse (exit 2, one line naming the path, its owner and mode, and the fix) a search directory
    another user owns, or one in which group or others may write. Nothing is written here; a
    directory that does not exist yet is the launch's to create. ``launch``: the fix offered is a
    new search.revision, else reading the search instead."""
    if not os.path.lexists(search_dir):
        return
    found = trespass(search_dir)
    if found is None:
        return
    if found.foreign:
        fix = "choose another search.revision" if launch else f"only its owner writes to it; read it with `parcel-hpc status {search_dir}`"
        raise UsageError(
            f"{found.path} is owned by {user_name(found.uid)} (mode {found.mode:04o}), not by you ({current_user()}): "
            f"a search directory must be yours alone; {fix}"
        )
    raise UsageError(
        f"{found.path} is writable by its group or others (mode {found.mode:04o}): they could replace what the search trusts; "
        f"run `chmod -R g-w,o-w {search_dir}`{' or choose another search.revision' if launch else ''}"
    )
