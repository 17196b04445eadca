"""One error root for parcel_hpc, and the exit code each kind maps to.

    ParcelError                      exit 1: a bug or an unexpected state; never a user's fault
    ├── UsageError                   exit 2: bad input; the message names the problem and the fix
    │   ├── SchedulerUnavailable     SLURM cannot be reached (no SLURM_CONF, slurmctld down)
    │   ├── NotTheSearch             the directory under a search's name is not the search a process acts for (anchor.py)
    │   └── AccountingError          sacct failed or its text could not be parsed
    ├── CorruptRecord                exit 2: a record on disk is unreadable (not a torn last line)
    ├── CheckpointCollision          exit 2: another trial's claim or checkpoint in our directory (claims.py)
    └── GovernanceRefusal            exit 3: the search refused to go on; carries the outcome string
                                     (an ``Outcome``: ``reject:<field>``, ``hold:budget``); defined
                                     beside ``Outcome`` in ``governance.outcome``, so this root imports
                                     nothing above it

A PermissionError anywhere (another user's search, an unreadable folder) is bad input too: one
line naming the path, exit 2; so is any other refusal of the operating system (a full disk, a
read-only mount: ``os_error_line``). Anything else that escapes a command is a bug of ours: one line
naming it, exit 1 (``PARCEL_TRACEBACK=1`` shows where). No traceback reaches a user.

Not errors: ``EXIT_PENDING`` (4), ``reconcile``'s answer when the scheduler has not filed every job
in full yet (its report is printed; rerun it, or pass ``--wait SECONDS``).

Messages are one line: every entry point ends through ``exit_on_error``, which prints
``error: <message>`` (or the outcome string first) and exits with the kind's code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator

from parcel_hpc.console import plain  # imports nothing of parcel_hpc either

EXIT_PENDING = 4
# The Pythons parcel_hpc runs on: from the first, below the second. Hydra 1.3.8, which composes every
# entry point's config, fails on 3.14 ("badly formed help string", hydra issue 3121). pyproject.toml's
# requires-python and scripts/_env.sh say the same (tests/test_python_range.py holds them together).
PYTHON_RANGE = ((3, 11), (3, 14))
TRACEBACK_ENV = "PARCEL_TRACEBACK"  # set (to anything): an unexpected error shows its traceback


class ParcelError(Exception):
    exit_code = 1
    headline = ""  # a line printed on stdout before the message, for scripts to match on (a refusal's outcome)


class UsageError(ParcelError):
    exit_code = 2


class SchedulerUnavailable(UsageError):
    pass


class ReleaseFailed(SchedulerUnavailable):
    """The jobs were submitted and recorded, but could not be released from their hold."""


class AccountingError(UsageError):
    pass


class NotTheSearch(UsageError):
    """The directory under a search's name is not the search this process acts for: moved away and
    replaced, re-owned, or opened to others (``anchor``). Nothing is read from it or written to it."""


class CorruptRecord(ParcelError):
    exit_code = 2


def require_supported_python(version: tuple[int, ...] | None = None) -> None:
    """Refuse, in one line (exit 2), a Python outside ``PYTHON_RANGE``; ``version`` defaults to this one's."""
    found = tuple(sys.version_info[:3] if version is None else version[:3])
    low, high = PYTHON_RANGE
    if not low <= found[:2] < high:
        shown = ".".join(map(str, found))
        raise UsageError(
            f"parcel_hpc runs on Python {low[0]}.{low[1]} to {high[0]}.{high[1] - 1}, not {shown}"
            f" (Hydra 1.3.8 fails on 3.14: hydra issue 3121); run it with python3.13 or older, e.g. PYTHON=python3.13 bash scripts/test.sh"
        )


def one_line(text: str) -> str:
    """A message on one line; what it quotes from records reaches the terminal without its controls."""
    return " ".join(part.strip() for part in plain(text).splitlines() if part.strip())


def permission_line(exc: PermissionError) -> str:
    where = exc.filename if exc.filename is not None else "a file or folder"
    return f"{where}: permission denied; run the command as a user its permissions let in (its owner, or one its group may read or write), see `ls -ld {where}`"


# What to do about an operating system's refusal, by errno; any other: check the path it names.
_OS_FIXES = {
    errno.ENOSPC: "its filesystem is full: free space there and rerun the same command (what was written before stays whole)",
    errno.EDQUOT: "you are over your disk quota there: free space and rerun the same command (what was written before stays whole)",
    errno.EROFS: "that filesystem is mounted read-only: run the command where it can be written (read commands write nothing)",
}


def os_error_line(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else "a file or folder"
    return f"{where}: {exc.strerror or exc}; {_OS_FIXES.get(exc.errno or 0, 'check that path and rerun')}"


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    try:
        yield
    except ParcelError as exc:
        if exc.headline:  # the outcome string comes first so scripts can match on it
            print(exc.headline)
            if str(exc) != exc.headline:
                print(one_line(str(exc)), file=sys.stderr)
        else:
            print(f"error: {one_line(str(exc))}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except PermissionError as exc:
        print(f"error: {one_line(permission_line(exc))}", file=sys.stderr)
        raise SystemExit(UsageError.exit_code) from None
    except BrokenPipeError:  # the reader of stdout left: the entry point ends quietly
        raise
    except OSError as exc:
        print(f"error: {one_line(os_error_line(exc))}", file=sys.stderr)
        raise SystemExit(UsageError.exit_code) from None
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(
            f"error: {type(exc).__name__}: {one_line(str(exc)) or 'no message'} (an error of parcel_hpc, not of your input: "
            f"rerun with {TRACEBACK_ENV}=1 to see where, and report it)",
            file=sys.stderr,
        )
        raise SystemExit(ParcelError.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted: trials already dispatched keep running; `parcel-hpc status SEARCH_DIR` tells their state", file=sys.stderr)
        raise SystemExit(130) from None
