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
