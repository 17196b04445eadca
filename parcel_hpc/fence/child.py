"""Trainer code run in a forked child that arms the fence first, for a process that must itself stay
unfenced: the launch (the local executor's workers are its children and would inherit its fence, and
it reads the snapshot again for every launch) and ``check-trainer``.

The fork has one thread, the one that forked, so the kernel layer holds the whole child; it gets a
temporary folder of its own, made before it is fenced (``TMPDIR`` and ``tempfile`` point at it), since
a fenced process can make nothing new in a folder on the way to a protected file, ``/tmp`` included
when the data lies under it. The child answers in JSON on a pipe, a line for each stage it runs (the
launch's trainer checks, then its preflight: the trainer's code imported once for both), and nothing
of its answer is ever unpickled: trainer code runs in it and may write anything to that pipe (lines
that are not answers are passed over; a stage answered twice has none). What comes back is data the
parent checks like any other input (a code digest that is not the copy's is ``reject:trainer`` at
the freeze); a reach for a protected file is ``reject:final_partition`` (exit 3); the trainer's own
error is its line (exit 2), as it would have been in the parent.

Must not: return anything but JSON values, or run a stage unfenced when the fence cannot be armed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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

    def once() -> Iterator[Any]:
        yield fn(*args)

    return run_fenced_stages(protected, (what,), once)[0].result()


@dataclass(frozen=True)
class StageAnswer:
    """One stage's answer from a fenced child. ``data`` is None where the child ended first."""

    what: str
    data: dict[str, Any] | None
    status: int

    def result(self) -> Any:
        """The stage's (JSON) value, or its error raised here, named by ``what``."""
        return _returned(self.data, self.status, self.what)


def run_fenced_stages(protected: Protected, whats: Sequence[str], stages: Callable[[], Iterator[Any]]) -> list[StageAnswer]:
    """The values ``stages()`` yields, each computed in one forked child fenced from ``protected``, so
    the trainer's code is imported once for all of them: one answer for each of ``whats``, each
    raising its own error when asked. A stage that fails (an error, or trainer code that tripped the
    fence) is the last one run; those after it answer as if the child ended before them."""
    with tempfile.TemporaryDirectory(prefix="parcel-fenced-") as scratch:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                _child(protected, scratch, stages, len(whats), write_end)
            finally:
                os._exit(0)  # never the parent's cleanup: no atexit, no finally of the caller
        os.close(write_end)
        try:
            data = _read(read_end)
        finally:
            os.close(read_end)
            _, status = os.waitpid(pid, 0)
    frames = _frames(data)
    return [StageAnswer(what, frames.get(i), status) for i, what in enumerate(whats)]


def _child(protected: Protected, scratch: str, stages: Callable[[], Iterator[Any]], count: int, fd: int) -> None:
    """Each stage's answer written as one line as soon as it is known: a stage that ends the process
    leaves the answers before it whole."""
    os.environ["TMPDIR"] = tempfile.tempdir = scratch
    try:
        arm(protected)
    except Unfenceable as exc:
        _answer(fd, {"stage": 0, "refused": exc.detail, "tripped": []})
        return
    values = stages()
    for stage in range(count):
        seen = len(tripped())
        try:
            answer: dict[str, Any] = {"value": next(values)}
        except GovernanceRefusal as exc:
            answer = {"refusal": [str(exc.outcome), exc.detail]}
        except UsageError as exc:
            answer = {"usage": str(exc)}
        except BaseException as exc:  # the trainer's code, whatever it raised: the parent says it in one line
            answer = {"failed": f"{type(exc).__name__}: {one_line(str(exc)) or '(no message)'}"}
        answer["tripped"] = list(tripped()[seen:])
        _answer(fd, {"stage": stage, **answer})
        if "value" not in answer or answer["tripped"]:
            return


def _answer(fd: int, answer: dict[str, Any]) -> None:
    try:
        data = json.dumps(answer).encode()
    except (TypeError, ValueError) as exc:
        data = json.dumps({"stage": answer["stage"], "failed": f"the answer is not JSON ({exc})", "tripped": answer.get("tripped", [])}).encode()
    view = memoryview(b"\n" + data + b"\n")  # a line of its own, whatever trainer code wrote before it
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


def _frames(data: bytes) -> dict[int, dict[str, Any] | None]:
    """Each stage's answer by its number; lines that are not answers (trainer code wrote them) are
    passed over. A stage answered twice has no answer (one of the two was not the child's), unless
    either names a fence trip: a forged line cannot turn a trip into a plain error."""
    frames: dict[int, dict[str, Any] | None] = {}
    for line in data.split(b"\n"):
        try:
            frame = json.loads(line)
        except (ValueError, RecursionError):  # nested past the parser's depth: not an answer either
            continue
        if not isinstance(frame, dict) or not isinstance(stage := frame.get("stage"), int):
            continue
        if stage in frames:
            trips = [t for f in (frames[stage], frame) if f for t in (f.get("tripped") or [])]
            frame = {"stage": stage, "tripped": trips} if trips else None
        frames[stage] = frame
    return frames


def _returned(answer: dict[str, Any] | None, status: int, what: str) -> Any:
    if answer is None:
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
