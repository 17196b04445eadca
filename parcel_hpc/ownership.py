"""Who this process is, and whether a search directory, its root and the folders a search writes
beside it are safe for it.

Searches share roots with other users' searches (a team root is group-writable). What a search
writes is executed or trusted later (submitit's pickles, the contract, the journals, the code
copy), so a search directory must be this user's alone: owned by this uid and writable by nobody
else (``fsio.owner_only_writes`` keeps everything created inside it that way). A search directory
that is not is refused before anything is written in it (``require_own_search``). So is a folder a
search writes its checkpoints or its releases into (``require_own_folder``).

The root is the team's: its group may write it, but without the sticky bit any member may rename
a search in it away and put another in its place (setgid 2775; 3775 adds the sticky bit, and then
only an entry's owner may rename it). A root, or any folder above it, that its group or others may
write without the sticky bit is refused at the launch (``require_closed_root``) unless the team
accepts it knowingly (``search.allow_renames_in_root=true``): then the search's identity checks
(``anchor``) are what stops a swapped directory. Ownership of the root and the folders above it
is not judged: whoever owns them (root, an admin) can rename anything below them anyway.

Owns: ``current_user`` (the process's own uid, never ``$LOGNAME``/``$USER``, which anyone sets),
``require_own_search``, ``require_own_folder`` and ``require_closed_root``. Must not change a mode
or an owner: the fix is the user's to run.
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

    def said(self, owner: int | None = None) -> str:
        """What is wrong, in words; ``owner``: whose it must be (this process's user by default)."""
        owner = os.getuid() if owner is None else owner
        if self.uid != owner:
            whose = f"you ({user_name(owner)})" if owner == os.getuid() else user_name(owner)
            return f"{self.path} is owned by {user_name(self.uid)} (mode {self.mode:04o}), not by {whose}"
        return f"{self.path} is writable by its group or others (mode {self.mode:04o})"


def trespass(top: Path, uid: int | None = None) -> Trespass | None:
    """The first path under ``top`` (``top`` included) owned by another uid than ``uid`` (this
    process's by default), or a file or directory its group or others may write; None when the whole
    tree is ``uid``'s alone. Symlinks are judged by their owner (their own mode is always 0777) and,
    below ``top``, never followed; a ``top`` that is a link is judged, then the directory it names."""
    uid = os.getuid() if uid is None else uid
    for path, st in _tree(top):
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != uid or (not stat.S_ISLNK(st.st_mode) and mode & OTHERS_WRITE):
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
        raise UsageError(f"{found.said()}: a search directory must be yours alone; {fix}")
    raise UsageError(
        f"{found.said()}: they could replace what the search trusts; run `chmod -R g-w,o-w {search_dir}`{' or choose another search.revision' if launch else ''}"
    )


RENAMES_KEY = "search.allow_renames_in_root"  # a team's knowing acceptance of a root without the sticky bit


def open_to_renames(path: Path) -> tuple[Path, int] | None:
    """The first folder among ``path`` and those above it (as named, and as its links resolve) that
    its group or others may write without the sticky bit, with its mode: they may rename what it
    holds. None when there is none (a folder that does not exist yet is judged by those above it)."""
    named = Path(os.path.abspath(path))
    chain = [named, *named.parents, *(p for real in [named.resolve()] for p in (real, *real.parents))]
    for folder in dict.fromkeys(chain):
        try:
            mode = stat.S_IMODE(os.stat(folder).st_mode)
        except FileNotFoundError:
            continue
        if mode & OTHERS_WRITE and not mode & stat.S_ISVTX:
            return folder, mode
    return None


def require_closed_root(root: Path, *, allowed: bool) -> None:
    """Refuse (exit 2, one line) a search root that its group or others, or those of a folder above
    it, may rename searches in, unless ``allowed`` (``RENAMES_KEY``): the team accepted it knowingly."""
    found = open_to_renames(root)
    if found is None or allowed:
        return
    folder, mode = found
    raise UsageError(
        f"{folder} is writable by its group or others without the sticky bit (mode {mode:04o}), so any of them can rename your search away "
        f"and put their own in its place; have its owner run `chmod +t {folder}` (a team root 3775: members add searches, never move another's), "
        f"or accept it knowingly with {RENAMES_KEY}=true (every process of the search then checks its directory's identity)"
    )


def require_own_folder(folder: Path, what: str) -> None:
    """Refuse (exit 2, one line naming ``what``, the owner and mode, and the fix) a folder the search
    writes into that another user owns or that its group or others may write (or anything in it):
    they could replace what the search wrote there. A folder that does not exist yet is the caller's
    to create."""
    if not os.path.lexists(folder):
        return
    found = trespass(folder)
    if found is None:
        return
    fix = "give a folder of your own" if found.foreign else f"run `chmod -R g-w,o-w {folder}` or give a folder of your own"
    raise UsageError(f"{what} {folder}: {found.said()}, so others could replace what the search keeps there; {fix}")
