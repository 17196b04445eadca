"""A small filesystem of its own for the tests of a full disk: a tmpfs mounted (tests run as root)
and filled to its last byte."""

import contextlib
import errno
import os
import subprocess
from pathlib import Path


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """``path`` made and mounted as a tmpfs of ``size`` (``8k``, ``4m``) while the block runs; the
    user's alone (0755: a tmpfs is 1777 by default, which a ``checkpoint.dir`` may not be)."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)  # lazy: a process still closing a file never fails the test


def fill(folder: Path) -> Path:
    """Fill ``folder``'s filesystem to the last byte with one file; the file."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 65536):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler
