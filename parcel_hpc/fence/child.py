"""Trainer code run in a forked child that arms the fence first, for a process that must itself stay
unfenced: the launch (the local executor's workers are its children and would inherit its fence, and
it reads the snapshot again for every launch) and ``check-trainer``.

The fork has one thread, the one that forked, so the kernel layer holds the whole child; it gets a
temporary folder of its own, made before it is fenced (``TMPDIR`` and ``tempfile`` point at it), since
a fenced process can make nothing new in a folder on the way to a protected file, ``/tmp`` included
when the data lies under it. A ``FencedChild`` runs one call after another in one child, so trainer
code a launch runs twice (its checks, then its preflight) is imported once: Lightning's import alone is
seconds of CPU. The parent sends each call (a module-level function and its arguments) pickled; the
child answers in JSON, and nothing of its answer is ever unpickled: trainer code runs in it and may
write anything to that pipe. What comes back is data the parent checks like any other input (a code
digest that is not the copy's is ``reject:trainer`` at the freeze); a reach for a protected file is
``reject:final_partition`` (exit 3); the trainer's own error is its line (exit 2), as it would have
been in the parent.

Must not: return anything but JSON values, or run a call unfenced when the fence cannot be armed.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

from parcel_hpc.errors import UsageError, one_line
from parcel_hpc.fence.arming import arm
from parcel_hpc.fence.audit import tripped
from parcel_hpc.fence.protected import Protected, Unfenceable
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

MAX_ANSWER_BYTES = 1 << 30  # a request (a preflight's examples) or an answer; longer is not one, whatever wrote it
_LENGTH = struct.Struct(">Q")  # each message on a pipe: its length, then its bytes


def run_fenced(protected: Protected, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child fenced from ``protected``: its (JSON) value, or its error
    raised here. ``what`` says what the child does, for the lines that name it ("the launch's preflight")."""
    with FencedChild(protected) as child:
        return child.call(what, fn, *args)


class FencedChild:
    """One forked child fenced from ``protected``, forked at the first call and ended by ``close`` (or
    the ``with`` block): each ``call(what, fn, *args)`` is ``fn(*args)`` run in it. The first call is
    in the child as it was forked; a later one is pickled to it: a module-level function and arguments
    pickle can carry."""

    def __init__(self, protected: Protected) -> None:
        self._protected = protected
        self._pid = 0
        self._requests = self._answers = -1
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> FencedChild:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            if self._pid:
                _send(self._requests, pickle.dumps((fn, args)))
            else:
                self._start(fn, args)
            data = _receive(self._answers)
        except (BrokenPipeError, EOFError):  # the child ended: trainer code exited or was killed
            data = None
        answer = _parsed(data)
        if answer is None:
            status = self._end()
            code = os.waitstatus_to_exitcode(status)
            ended = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            raise UsageError(f"{what}: the trainer's code ended the fenced process before it answered (it {ended}); run it alone to see why")
        return _value(answer, what)

    def close(self) -> None:
        if self._pid:
            self._end()

    def _start(self, fn: Callable[..., Any], args: tuple) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="parcel-fenced-")
        request_read, self._requests = os.pipe()
        self._answers, answer_write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:
            try:
                os.close(self._requests)
                os.close(self._answers)
                _serve(self._protected, self._scratch.name, request_read, answer_write, (fn, args))
            finally:
                os._exit(0)  # never the parent's cleanup: no atexit, no finally of the caller
        os.close(request_read)
        os.close(answer_write)

    def _end(self) -> int:
        """Close the child's pipes (it ends at the end of its requests; one that does not is killed) and
        reap it: its wait status."""
        os.close(self._requests)
        os.close(self._answers)
        status = _reap(self._pid)
        self._pid = 0
        if self._scratch is not None:
            self._scratch.cleanup()
        return status


def _reap(pid: int) -> int:
    for _ in range(200):  # a child at the end of its requests exits at once; one still running trainer code is ended
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _serve(protected: Protected, scratch: str, requests: int, answers: int, first: tuple[Callable[..., Any], tuple]) -> None:
    """The child: fenced once, then the first call and each request after it answered in turn, until
    the parent closes its end."""
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    try:
        arm(protected)
        refused = ""
    except Unfenceable as exc:
        refused = exc.detail
    fn, args = first
    while True:
        _send(answers, _answer({"refused": refused} if refused else _run(fn, args)))
        try:
            fn, args = pickle.loads(_receive(requests))  # the parent's own request
        except EOFError:
            return


def _run(fn: Callable[..., Any], args: tuple) -> dict[str, Any]:
    try:
        answer: dict[str, Any] = {"value": fn(*args)}
    except GovernanceRefusal as exc:
        answer = {"refusal": [str(exc.outcome), exc.detail]}
    except UsageError as exc:
        answer = {"usage": str(exc)}
    except BaseException as exc:  # the trainer's code, whatever it raised: the parent says it in one line
        answer = {"failed": f"{type(exc).__name__}: {one_line(str(exc)) or '(no message)'}"}
    answer["tripped"] = list(tripped())
    return answer


def _answer(answer: dict[str, Any]) -> bytes:
    try:
        return json.dumps(answer).encode()
    except (TypeError, ValueError) as exc:
        return json.dumps({"failed": f"the answer is not JSON ({exc})", "tripped": answer.get("tripped", [])}).encode()


def _send(fd: int, data: bytes) -> None:
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _receive(fd: int) -> bytes:
    """One message; ``EOFError`` when the other end closed before a whole one came."""
    size = _LENGTH.unpack(_exactly(fd, _LENGTH.size))[0]
    if size > MAX_ANSWER_BYTES:
        raise EOFError("longer than any answer")
    return _exactly(fd, size)


def _exactly(fd: int, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = os.read(fd, min(size - got, 1 << 16))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _parsed(data: bytes | None) -> dict[str, Any] | None:
    try:
        answer = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _value(answer: dict[str, Any], what: str) -> Any:
    """The value of an answer, or what it says went wrong raised: a refusal, bad input, a failure."""
    trips = [str(t) for t in answer.get("tripped") or []]
    if trips:
        raise GovernanceRefusal(
            Outcome.REJECT_FINAL_PARTITION, f"{what}: trainer code {trips[0]}; trainer code never reads the final partition or the snapshot"
        )
    if "refused" in answer:
        raise GovernanceRefusal(Outcome.REJECT_FINAL_PARTITION, f"{what}: {answer['refused']}")
    if "refusal" in answer:
        outcome, detail = answer["refusal"]
        raise GovernanceRefusal(Outcome.parse(outcome), str(detail))
    if "usage" in answer:
        raise UsageError(str(answer["usage"]))
    if "failed" in answer:
        raise UsageError(f"{what}: {answer['failed']}")
    return answer.get("value")
