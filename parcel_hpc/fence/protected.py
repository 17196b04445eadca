"""Which files the fence keeps from trainer code, and whether a process can be fenced from them.

The protected files are the final partition's lists (every ``final-*.json`` in the split's folder:
those there when the fence is armed, and any made there later) and the snapshot (it holds every
frame, the final ones too). Each is known by its inode, not only its path.

A file the fence cannot hold is refused before any trainer code runs (``Unfenceable``, outcome
``reject:final_partition``): one with a second name (a hard link elsewhere is the same bytes under a
path neither layer guards), or one mapped into this process's memory. A descriptor this process left
open on one is pointed at /dev/null first: trainer code could read through it, whatever either layer
says, since both judge opens.

Must not: arm anything (``kernel.py``, ``audit.py``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

FINAL_PREFIX, FINAL_SUFFIX = "final-", ".json"  # the final partition's lists (data/split.py writes final-<revision>.json)

Inode = tuple[int, int]  # (st_dev, st_ino)


class Unfenceable(GovernanceRefusal):
    """A protected file the fence cannot keep from trainer code here: nothing of the trainer may run."""

    def __init__(self, detail: str) -> None:
        super().__init__(Outcome.REJECT_FINAL_PARTITION, detail)


def is_final_name(name: str) -> bool:
    return name.startswith(FINAL_PREFIX) and name.endswith(FINAL_SUFFIX)


def inode_of(st: os.stat_result) -> Inode:
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True)
class Protected:
    """The protected files of one split and snapshot, as they are now."""

    split_dir: str  # real path of the split's folder: every final-*.json in it is protected, now and later
    split_dir_inode: Inode
    paths: tuple[str, ...]  # real paths of the protected files found: the final lists, then the snapshot
    inodes: tuple[Inode, ...]  # each path's inode, in the same order

    @classmethod
    def of(cls, split_path: str | os.PathLike, snapshot_path: str | os.PathLike) -> Protected:
        split_dir = os.path.realpath(Path(split_path).parent)
        finals = sorted(str(p) for p in Path(split_dir).iterdir() if is_final_name(p.name))
        found: dict[str, Inode] = {}
        for path in [*(os.path.realpath(p) for p in finals), os.path.realpath(snapshot_path)]:
            try:
                found.setdefault(path, inode_of(os.stat(path)))
            except FileNotFoundError:
                continue  # a missing snapshot is the loader's to say; there is nothing to read
        return cls(split_dir, inode_of(os.stat(split_dir)), tuple(found), tuple(found.values()))

    def refusal(self) -> str:
        """Why this process cannot be fenced from these files ("" when it can): a second name, or a mapping."""
        for path in self.paths:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                return (
                    f"{path} has {st.st_nlink} names (hard links): the fence guards its path, and another name reads the same bytes; "
                    f"remove the other links (find / -xdev -samefile {path}) and run again"
                )
        for line in _lines("/proc/self/maps"):
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[4] != "0" and os.path.realpath(fields[5]) in self.paths:
                return f"{fields[5]} is mapped into this process's memory, where trainer code could read it; the toolkit must not map a protected file"
        return ""

    def blind_descriptors(self) -> list[int]:
        """Point every descriptor this process holds on a protected file at /dev/null (its number stays
        taken, so whatever owns it closes /dev/null); the descriptors, for the record."""
        blinded = []
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                try:
                    held = inode_of(os.fstat(fd))
                except OSError:
                    continue  # the listing's own descriptor, closed since
                if held in self.inodes and fd != null:
                    os.dup2(null, fd, inheritable=False)
                    blinded.append(fd)
        finally:
            os.close(null)
        return blinded


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []  # no /proc: nothing to find there
