"""Trainer code run in a forked child that arms the fence first, for a process that must itself stay
unfenced: the launch (the local executor's workers are its children and would inherit its fence, and
it reads the snapshot again for every launch) and ``check-trainer``.

The fork has one thread, the one that forked, so the kernel layer holds the whole child; it gets a
temporary folder of its own, made before it is fenced (``TMPDIR`` and ``tempfile`` point at it), since
a fenced process can make nothing new in a folder on the way to a protected file, ``/tmp`` included
when the data lies under it. The child
answers in JSON on a pipe and nothing of its answer is ever unpickled: trainer code runs in it and may
write anything to that pipe. What comes back is data the parent checks like any other input (a code
digest that is not the copy's is ``reject:trainer`` at the freeze); a reach for a protected file is
``reject:final_partition`` (exit 3); the trainer's own error is its line (exit 2), as it would have
been in the parent.

Must not: return anything but JSON values, or run ``fn`` unfenced when the fence cannot be armed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from parcel_hpc.errors import UsageError, one_line
from parcel_hpc.fence.arming import arm
from parcel_hpc.fence.audit import tripped
from parcel_hpc.fence.protected import Protected, Unfenceable
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

MAX_ANSWER_BYTES = 16 * 2**20  # a trainer's identity and a preflight's words; more is not an answer


def run_fenced(protected: Protected, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked child fenced from ``protected``: its (JSON) value, or its error
    raised here. ``what`` says what the child does, for the lines that name it ("the launch's preflight")."""
    with tempfile.TemporaryDirectory(prefix="parcel-fenced-") as scratch:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                _answer(write_end, _child(protected, scratch, fn, args))
            finally:
                os._exit(0)  # never the parent's cleanup: no atexit, no finally of the caller
        os.close(write_end)
        try:
            data = _read(read_end)
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
    return _returned(data, status, what)


def _child(protected: Protected, scratch: str, fn: Callable[..., Any], args: tuple) -> dict[str, Any]:
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    try:
        arm(protected)
    except Unfenceable as exc:
        return {"refused": exc.detail}
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


def _answer(fd: int, answer: dict[str, Any]) -> None:
    try:
        data = json.dumps(answer).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"failed": f"the answer is not JSON ({exc})", "tripped": answer.get("tripped", [])}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read(fd: int) -> bytes:
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 16):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            return b""
        chunks.append(chunk)
    return b"".join(chunks)


def _returned(data: bytes, status: int, what: str) -> Any:
    try:
        answer = json.loads(data)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError:
        code = os.waitstatus_to_exitcode(status)
        ended = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        raise UsageError(f"{what}: the trainer's code ended the fenced process before it answered (it {ended}); run it alone to see why") from None
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
