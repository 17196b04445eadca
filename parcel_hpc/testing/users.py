"""Local users for tests of shared roots: two researchers in one group and an admin outside it.

Tests run as root (here and in CI) and create these users idempotently (several test processes may
ask at once), then run commands as them through ``setpriv``, with the umask a test chooses. The
users have no home directory and no password: they exist to own files and be refused.
"""

from __future__ import annotations

import grp
import os
import pickle
import pwd
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

TEAM = "parcel-team"  # the researchers' group: a team root is theirs, setgid and sticky (3775)
BOB = "parcel-bob"  # a researcher in TEAM
CAROL = "parcel-carol"  # another researcher in TEAM
ADMIN = "parcel-admin"  # reads everyone's searches; in a group of its own, not TEAM

_MEMBERS = {BOB: TEAM, CAROL: TEAM, ADMIN: ADMIN}


def ensure_user(name: str, group: str) -> int:
    """The uid of ``name``, created (with ``group`` as its primary group) if it does not exist."""
    if os.geteuid() != 0:
        raise PermissionError(f"creating the test user {name} needs root (tests that need other users run as root, as in CI)")
    _retry(["groupadd", "-f", group], lambda: _group_exists(group))
    _retry(["useradd", "-M", "-N", "-g", group, "-s", "/bin/sh", name], lambda: _user_exists(name))
    return pwd.getpwnam(name).pw_uid


def ensure_users() -> None:
    """BOB and CAROL in TEAM, ADMIN outside it."""
    for name, group in _MEMBERS.items():
        ensure_user(name, group)


def run_as(user: str, argv: Sequence[str], umask: int | None = None, cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``argv`` run as ``user`` (its uid, primary group and supplementary groups), text captured.
    ``umask``: the child's (None: this process's)."""
    entry = pwd.getpwnam(user)
    cmd = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *argv]
    return subprocess.run(cmd, cwd=cwd, umask=-1 if umask is None else umask, capture_output=True, text=True, timeout=timeout, env=_env(entry))


# A Python every test user can run (the project's virtualenv may be root's alone, as pyenv's shims are).
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
_EXCHANGE = "import ctypes, sys; ok = ctypes.CDLL(None, use_errno=True).renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 2); sys.exit(ok != 0)"


def exchange_line(a: str | os.PathLike, b: str | os.PathLike) -> str:
    """A shell line that exchanges two directories in one rename (``renameat2`` with
    RENAME_EXCHANGE), as anyone who may write the folder holding them can: no moment without either."""
    return f"{SYSTEM_PYTHON} -c {shlex.quote(_EXCHANGE)} {shlex.quote(str(a))} {shlex.quote(str(b))}"


class _Planted:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def planted_pickle(command: str) -> bytes:
    """What a member writes in place of a job's pickle: unpickling it runs ``command`` (``os.system``)."""
    return pickle.dumps(_Planted(command))


def team_dir(path: str | os.PathLike, mode: int = 0o3775) -> Path:
    """``path`` made a team directory: group TEAM, setgid, group-writable, and sticky by default
    (3775, the recommended team root); ``mode=0o2775``: a root whose members may rename each other's searches."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    os.chown(p, -1, grp.getgrnam(TEAM).gr_gid)
    os.chmod(p, mode)
    return p


def _env(entry: pwd.struct_passwd) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "USER", "LOGNAME")}
    return {**env, "HOME": "/tmp", "USER": entry.pw_name, "LOGNAME": entry.pw_name}


def _retry(argv: list[str], done: Callable[[], bool]) -> None:
    """useradd and groupadd lock /etc/passwd and /etc/group: a concurrent test process holding the
    lock, or creating the same name first, is waited for."""
    for _ in range(50):
        if done():
            return
        subprocess.run(argv, capture_output=True, text=True)
        if done():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{' '.join(argv)} did not take effect")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True
