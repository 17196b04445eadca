"""The one job probe: is this job alive, gone, or can this host not tell (``Liveness``).

Whether a process still runs is answered here: a claim's holder, a local trial's worker, a local
selection job, a launcher. A local job's id is its pid, meaningful only on the host that started it
(callers that know the host pass it; ``resolution`` and ``ledger.searches`` compare hosts
themselves before asking about a pid). SLURM's jobs are asked of squeue by the SLURM backend, whose
answer is the queue itself.

Must not: signal anything but signal 0, or guess: another host's process is ``UNKNOWN``.
"""

from __future__ import annotations

import enum
import os
import socket


class Liveness(enum.Enum):
    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"  # this host cannot tell (the process lives on another host)

    def as_bool(self) -> bool | None:
        return None if self is Liveness.UNKNOWN else self is Liveness.ALIVE


def seen_from_here(host: str, here: str = "") -> bool:
    """Whether a process started on ``host`` ("": this host) can be judged from ``here`` ("": this
    host): a pid means something only on the host that started it (the one statement of that rule)."""
    return not host or host == (here or socket.gethostname())


def local_process(pid: object, host: str = "") -> Liveness:
    """A process started on ``host`` ("": this host): alive, gone, or unknown from here."""
    if not seen_from_here(host):
        return Liveness.UNKNOWN
    return Liveness.ALIVE if pid_alive(pid) else Liveness.GONE


def pid_alive(pid_text: object) -> bool:
    """Whether the process with this pid lives on this host (and is no zombie). Asks the kernel
    (signal 0), not /proc alone: with ``hidepid`` other users' processes have no /proc entry."""
    try:
        pid = int(str(pid_text))
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


def runs_submitit(pid_text: object) -> bool:
    """Whether this pid is a submitit job process (a recycled pid is someone else's: never signal it)."""
    try:
        with open(f"/proc/{int(str(pid_text))}/cmdline", "rb") as f:
            return b"submitit" in f.read()
    except (ValueError, FileNotFoundError, ProcessLookupError, PermissionError):
        return False
