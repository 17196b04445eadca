"""Processes on this host: whether a pid is alive. The local executor's job ids are pids."""

from __future__ import annotations

import os


def pid_alive(pid_text: str) -> bool:
    """Whether the process with this pid lives on this host (and is no zombie). Asks the kernel
    (signal 0), not /proc alone: with ``hidepid`` other users' processes have no /proc entry."""
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False  # 0 and negatives name process groups, never one process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to look into
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False  # it ended between the signal and the read
    except (OSError, IndexError):
        return True  # it answered the signal; its state is hidden from us


def runs_submitit(pid_text: str) -> bool:
    """Whether this pid is a submitit job process (a recycled pid is someone else's: never signal it)."""
    try:
        with open(f"/proc/{int(pid_text)}/cmdline", "rb") as f:
            return b"submitit" in f.read()
    except (ValueError, FileNotFoundError, ProcessLookupError, PermissionError):
        return False
