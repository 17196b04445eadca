"""``parcel-hpc ARGV`` run in the test's own process (``cli.main``), with a time limit: its exit code,
stdout and stderr. Much cheaper than a subprocess for tests that run many commands (the hostile-read
fuzz runs every read command per example)."""

import contextlib
import io
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from parcel_hpc.cli import main


class Hung(Exception):
    """The command ran past its time limit (a read that blocks: a FIFO opened for reading, /dev/zero read whole)."""


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


def _stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)


def _expired(signum, frame):
    raise Hung()


def run_cli(argv: Sequence[str], timeout_s: int = 60) -> Ran:
    """Run ``parcel-hpc ARGV`` here; ``Hung`` past ``timeout_s`` (SIGALRM: the main thread only)."""
    out, err = _stream(), _stream()
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in argv])
            except SystemExit as done:
                code = done.code if isinstance(done.code, int) else 1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return Ran(code, out.buffer.getvalue().decode("utf-8", "replace"), err.buffer.getvalue().decode("utf-8", "replace"))
