"""Every search under a root: finding search directories (a ``contract.json`` at most
``MAX_DEPTH`` folders below the root: ``<search.root>/<revision>``, or a root of several users'
roots), whose each is, why one did not read, and whether a launcher still follows it. The summary
of each (what ``parcel-hpc list`` shows, its spend included) is ``accounting.listing``'s.

Whether a launcher is alive is decided from what it wrote (``launcher_state``, pure): a launch
rewrites ``launches/<id>.heartbeat`` every ``HEARTBEAT_S`` from the moment its contract is frozen
until it leaves, and then says how it left (``LauncherState``).

Must not write a byte: admins list other people's searches.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from parcel_hpc.errors import ParcelError, UsageError, permission_line
from parcel_hpc.ledger import HEARTBEAT_S, Heartbeat, LauncherState, SearchDir
from parcel_hpc.ownership import user_name
from parcel_hpc.probe import pid_alive, seen_from_here

MAX_DEPTH = 3  # <root>/<user>/<project>/<revision>: deep enough for shared roots, never the whole disk
# What reading one search of a root may raise when its records are damaged, hostile (JSON of the
# wrong shape included) or not this user's to read: that search is listed with it, the others shown.
UNREADABLE = (ParcelError, OSError, ValueError, KeyError, TypeError, AttributeError)
STALE_AFTER_S = 3 * HEARTBEAT_S  # a working launch that has not written for this long has gone


def launcher_state(
    launches: Sequence[Mapping], beats: Mapping[str, Heartbeat], now: float, host: str, alive: Callable[[int], bool], cancelled: bool = False
) -> LauncherState:
    """What became of the search's launches (pure): any that works on it now wins; else a cancelled
    search says so (whatever its last launch's word was: detached, ended); else the newest heartbeat
    says how its launch left, or, its word gone stale or its pid dead, that it is gone.
    ``alive(pid)`` is asked only for a launch on this ``host``; other hosts' clocks are trusted to
    agree with this one's within NTP's error, far below ``STALE_AFTER_S``."""
    for beat in beats.values():
        if beat.state is LauncherState.FOLLOWING and now - beat.at < STALE_AFTER_S and (not seen_from_here(beat.host, host) or alive(beat.pid)):
            return LauncherState.FOLLOWING
    if cancelled:
        return LauncherState.CANCELLED
    if beats:
        newest = max(beats.values(), key=lambda b: b.at)
        return LauncherState.GONE if newest.state is LauncherState.FOLLOWING else newest.state
    dispatched = any(l.get("dispatched") and not l.get("dry_run") for l in launches)
    return LauncherState.UNKNOWN if dispatched else LauncherState.NONE


def owner_of(search: SearchDir) -> str:
    """Whose the search is, and whose its spend: the user who owns its directory (its identity:
    ``anchor``), never a name its records say, which their owner can edit. "" when it is gone."""
    try:
        return user_name(search.path.stat().st_uid)
    except OSError:
        return ""


def current_launcher(search: SearchDir, now: float | None = None, launches: Sequence[Mapping] | None = None) -> LauncherState:
    """What the search's launch records (``launches``, when the caller has read them) and
    heartbeats say now (this host's pids are checked)."""
    now = time.time() if now is None else now
    launches = search.launches() if launches is None else launches
    cancelled = search.cancellation() is not None
    return launcher_state(launches, search.heartbeats(), now, socket.gethostname(), lambda pid: pid_alive(str(pid)), cancelled)


def find_searches(root: Path) -> Iterator[SearchDir]:
    """Search directories under ``root`` (``root`` itself included), sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory; give the search root (search.root, default ./runs) or a search directory")
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        try:  # a root shared by several users: list what this user may read, and what is still there
            if (d / "contract.json").is_file():
                found.append(d)
                return  # a search's own folders hold no searches
            if depth >= MAX_DEPTH:
                return
            children = sorted(e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
        except OSError:  # closed to this user, gone since it was listed, or a kernel folder (/proc/<pid>/net: EINVAL)
            return
        for child in children:
            walk(Path(child), depth + 1)

    walk(root, 0)
    return (SearchDir(p) for p in sorted(found))


def problem_of(exc: Exception) -> str:
    """Why a search did not read, in one line for its row."""
    if isinstance(exc, PermissionError):
        return permission_line(exc)
    if isinstance(exc, ParcelError | OSError):
        return str(exc) or type(exc).__name__
    return f"a record has the wrong shape ({type(exc).__name__}: {exc}): it is damaged; restore it or move it aside"
