"""Processes on this host: whether a pid is alive. The local executor's job ids are pids."""

from __future__ import annotations


def pid_alive(pid_text: str) -> bool:
    """Whether the process with this pid lives on this host (and is no zombie)."""
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def runs_submitit(pid_text: str) -> bool:
    """Whether this pid is a submitit job process (a recycled pid is someone else's: never signal it)."""
    try:
        with open(f"/proc/{int(pid_text)}/cmdline", "rb") as f:
            return b"submitit" in f.read()
    except (ValueError, FileNotFoundError, ProcessLookupError, PermissionError):
        return False
