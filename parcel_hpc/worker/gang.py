"""The gang's control channel: rank 0 and its peers agree at every step boundary (issue 50).

Rank 0 listens on a port of its host; every other rank connects once when its attempt starts and
says which rank of which job it is (a hello naming another job is turned away). After each step
every peer reports to rank 0 (the step, whether the scheduler's signal reached it, an error with
its traceback) and takes rank 0's decision for that step, so all ranks save, validate and stop at
the same step boundary (a signal that reached any rank is the gang's). Rank 0 decides a step ahead
(``LeaderSide``): at step s it sends the decision for step s+1, made from its own state and the
peers' reports on step s-1, so in the steady state no rank waits at a boundary (a collective in the
step has brought them together already); the first step of a run and each milestone's validation
are decided at once. Determined's distributed context does the same with ZeroMQ; this is plain TCP,
one JSON object a line, each naming its kind and step (a report or decision that arrives before the
one awaited is kept for later).

A peer that reports nothing within ``hang_s`` while rank 0 waits is hung: ``gather`` raises
``RankHung`` naming it and the step, and rank 0 ends the gang; a peer that hears no decision within
``hang_s`` raises ``RankHung`` for rank 0. A closed connection (a rank killed, its node gone) is
``RankLost``. The bound is the caller's: the runtime passes the launcher's signal delay.

Must not: decide anything (the decision is the caller's, sent as given) or carry a checkpoint's
bytes (each rank writes its own part: ``checkpoints/gang.py``).
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.checkpoints.format import Checkpoint
from parcel_hpc.checkpoints.gang import GangCheckpoints, GangRestore, trainer_extra
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.ledger.events import DeviceUse, decode_payload, encode_payload
from parcel_hpc.trainer import TrainerState, TrainingData
from parcel_hpc.trainer.run import Due, Restored, Run, Stop, stopping_due

FIRST_STEP_BOUND_S = 600.0  # a gang's first step (the build, the rendezvous, a compiling first step) may take this long
STEP, VALIDATED, USED = "step", "validated", "used"  # what a report or a decision is about (USED: a rank's GPUs, at its end)
_LINE_LIMIT = 1 << 20  # a report or a decision is small; a longer line is a broken peer
# Where a gang's master port (and its channel's, one above) is drawn from, by its job id: below Linux's
# default ephemeral range (32768-60999), where any outgoing connection's local port could hold it (CI
# once drew 33000 while a client held it), and above the dev clusters' own ports (16817.., 19817..).
_PORTS = (21000, 32767)
_PAIRS = (_PORTS[1] - _PORTS[0]) // 2  # (master, channel) pairs in the range


@dataclass(frozen=True)
class GangEnv:
    """Where a rank is in its gang, as torch.distributed's ``env://`` reads it: set before the trainer
    is imported, so ``init_process_group`` (and Lightning, and Accelerate) find it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str  # the job's first host: rank 0 runs there
    master_port: int
    job_id: str  # every hello on the channel names it: a peer of another job is turned away

    @classmethod
    def of_job(cls, job_id: str, rank: int, world_size: int, local_rank: int, local_world_size: int, hosts: list[str]) -> GangEnv:
        """From the scheduler's job (submitit's ``JobEnvironment``; ``job_id`` its raw id, one per job
        and kept by a requeue): the port drawn from it, so every rank of the job, and a requeued run of
        it, names the same one without talking first. Numbered jobs take pairs in turn, so jobs
        running together on a node share a port only when their ids are ``_PAIRS`` apart (a hash put
        two at random in one pair); then the later one's rank 0 fails to listen, and its peers, whose
        hello names their job, are turned away by the other's."""
        pair = int(job_id) % _PAIRS if job_id.isdigit() else zlib.crc32(job_id.encode()) % _PAIRS
        return cls(rank, world_size, local_rank, local_world_size, hosts[0], _PORTS[0] + 2 * pair, job_id)

    def devices(self, visible: str, gpus_per_rank: int) -> str | None:
        """This rank's share of the GPUs its node's ranks were handed together (the local executor
        hands a job's GPUs to all its tasks): the ``CUDA_VISIBLE_DEVICES`` to set, or None to leave it."""
        named = [d for d in visible.split(",") if d.strip()]
        if gpus_per_rank < 1 or len(named) != gpus_per_rank * self.local_world_size:
            return None  # already one rank's (SLURM's --gpus-per-task), or none
        return ",".join(named[self.local_rank * gpus_per_rank : (self.local_rank + 1) * gpus_per_rank])

    @property
    def channel_port(self) -> int:
        """The toolkit's own channel (``Leader``/``Peer``), beside torch's."""
        return self.master_port + 1

    def environ(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


@dataclass(frozen=True)
class Report:
    """What a rank tells rank 0 after a step."""

    rank: int
    step: int
    signalled: bool = False  # the scheduler's signal reached this rank
    error: str | None = None  # this rank's exception with its traceback: the trial's failure
    cause: str | None = None  # its failure class (``Cause``'s value), as the rank that raised it classified it
    kind: str = STEP  # after a step (``STEP``), after the milestone's validation (``VALIDATED``), or its last word (``USED``)
    use: DeviceUse | None = None  # ``USED``: what this rank read of its GPUs (``worker/devices.py``)
    at: float = 0.0  # an error's: when it was raised, by its node's clock (the first of several is the cause)

    def to_json(self) -> dict[str, Any]:
        use = encode_payload(self.use, drop_empty=True) if self.use is not None else None
        out = {"kind": self.kind, "step": self.step, "signalled": self.signalled, "error": self.error, "cause": self.cause, "use": use}
        return {**out, "at": self.at} if self.error is not None else out

    @classmethod
    def of(cls, rank: int, obj: Mapping[str, Any]) -> Report:
        use, at = _use_of(obj.get("use")), obj.get("at")
        at = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
        return cls(rank, int(obj["step"]), bool(obj.get("signalled")), obj.get("error"), obj.get("cause"), str(obj.get("kind", STEP)), use, at)

    def failed(self) -> RankFailed:
        return RankFailed(self.rank, self.step, str(self.error), self.cause)


def first_failure(reports: Iterable[Report]) -> RankFailed | None:
    """The failure that caused the others: when one rank raises, its peers' collectives fail after it
    (``Connection closed by peer``); the earliest raised (by the ranks' clocks, NTP-close on a cluster)
    is the trial's failure, rank order breaking a tie. A rank's request for the final partition comes
    first whenever it came: the trial's rejection, whatever failed around it."""
    failed = sorted((r for r in reports if r.error is not None), key=lambda r: (r.cause != FINAL_PARTITION, r.at, r.rank))
    return failed[0].failed() if failed else None


def _use_of(obj: Any) -> DeviceUse | None:
    """A rank's reading as it sent it; None where it sent none or a malformed one (its GPUs unread, never guessed)."""
    if not isinstance(obj, dict):
        return None
    try:
        return decode_payload(DeviceUse, obj, {}, ("devices",))
    except (TypeError, ValueError):
        return None


class RankHung(RuntimeError):
    """A rank sent nothing for ``hang_s`` while the gang waited on it. ``in_step``: rank 0 waited inside a
    step (in a collective, most often), where every rank still in it is named (``ranks``): which one
    stopped first, the others waiting on it in the same collective, no rank can tell."""

    def __init__(self, rank: int, step: int, waited_s: float, in_step: bool = False, ranks: tuple[int, ...] = ()) -> None:
        self.rank, self.step, self.waited_s, self.ranks = rank, step, waited_s, ranks or (rank,)
        who = f"rank {rank}" if len(self.ranks) == 1 else "ranks " + ", ".join(map(str, self.ranks[:-1])) + f" and {self.ranks[-1]}"
        where = (
            f"never finished step {step}: rank 0 waited {waited_s:.0f} s in it (in a collective, most often)"
            if in_step
            else f"sent nothing for {waited_s:.0f} s at step {step} while the gang waited on it"
        )
        super().__init__(f"{who} {where}; the gang is ended")


class RankLost(RuntimeError):
    """A rank's connection closed (the process died, its node went down)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step
        super().__init__(f"rank {rank} left the gang at step {step} (its process or node is gone)")


class _Line:
    """One connection, read a line at a time against a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a report and a decision a step: each sent at once
        self.sock, self.buffer = sock, b""

    def send(self, obj: Mapping[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def receive(self, deadline: float, clock: Callable[[], float]) -> dict[str, Any] | None:
        """The next object, or None when the deadline passed; ``EOFError`` when the peer closed."""
        while b"\n" not in self.buffer:
            left = deadline - clock()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                raise EOFError from None
            if not chunk:
                raise EOFError
            self.buffer += chunk
            if len(self.buffer) > _LINE_LIMIT:
                raise EOFError
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def peek(self) -> list[dict[str, Any]]:
        """Without taking them (another thread may be reading these lines later): every object that has
        arrived whole, none waited for (a peer that closed has sent all it will)."""
        waiting = b""
        try:
            if select.select([self.sock], [], [], 0)[0]:  # never waits: the socket's own timeout would
                waiting = self.sock.recv(_LINE_LIMIT, socket.MSG_PEEK)
        except OSError:
            pass
        *whole, _ = (self.buffer + waiting).split(b"\n")
        return [json.loads(line) for line in whole if line]

    def close(self) -> None:
        self.sock.close()


class Leader:
    """Rank 0's end: every peer connected, then ``gather`` and ``send`` once a step."""

    def __init__(self, peers: dict[int, _Line], hang_s: float, clock: Callable[[], float], where: Mapping[int, tuple[str, int]] | None = None) -> None:
        self._peers, self.hang_s, self._clock = peers, hang_s, clock
        self.where = dict(where or {})  # rank -> (host, pid) as its hello said: a hung rank on this host is ended by its pid
        self._kept: dict[int, list[Report]] = {rank: [] for rank in peers}  # reports read before the one awaited
        self._heard: dict[int, int] = {rank: 0 for rank in peers}  # the last step each peer reported after
        self.signalled = False  # a report read so far said the scheduler's signal reached its rank

    @classmethod
    def open(cls, port: int, world_size: int, *, hang_s: float, job: str, clock: Callable[[], float] = time.monotonic) -> Leader:
        """Listen on ``port`` (every interface: peers on other nodes reach it by the host's name) until
        all ``world_size - 1`` peers of ``job`` said hello; a peer that never came within ``hang_s`` is
        ``RankHung`` at step 0."""
        server = socket.create_server(("", port), reuse_port=False)
        peers: dict[int, _Line] = {}
        where: dict[int, tuple[str, int]] = {}
        deadline = clock() + hang_s
        try:
            while len(peers) < world_size - 1:
                server.settimeout(max(0.0, deadline - clock()))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    absent = min(set(range(1, world_size)) - set(peers))
                    raise RankHung(absent, 0, hang_s) from None
                line = _Line(conn)
                try:
                    hello = line.receive(deadline, clock)
                except (EOFError, ValueError):
                    hello = None
                if not isinstance(hello, dict):
                    line.close()
                    continue
                rank = hello.get("rank")
                if hello.get("job") != job or not isinstance(rank, int) or not 0 < rank < world_size or rank in peers:
                    line.close()  # not one of ours (a port scan, a peer of another job drawn the same port)
                    continue
                peers[rank] = line
                where[rank] = (str(hello.get("host", "")), int(hello.get("pid", 0)))
        except BaseException:
            for line in peers.values():
                line.close()
            raise
        finally:
            server.close()
        return cls(peers, hang_s, clock, where)

    def gather(self, step: int, kind: str = STEP) -> list[Report]:
        """Every peer's report of ``kind`` on ``step``, in rank order; a peer's reported error stands in
        for it (whatever it was awaited for). Reports read on the way are kept for their turn."""
        return [self._report(rank, line, step, kind) for rank, line in sorted(self._peers.items())]

    def _report(self, rank: int, line: _Line, step: int, kind: str) -> Report:
        kept = self._kept[rank]
        found = next((r for r in kept if r.error is not None or (r.kind, r.step) == (kind, step)), None)
        began = self._clock()
        while found is None:
            try:
                got = line.receive(began + self.hang_s, self._clock)
            except EOFError:
                raise RankLost(rank, step) from None
            if got is None:
                raise RankHung(rank, step, self._clock() - began)
            report = Report.of(rank, got)
            self.signalled = self.signalled or report.signalled
            if report.kind == STEP:
                self._heard[rank] = max(self._heard[rank], report.step)
            if report.error is not None or (report.kind, report.step) == (kind, step):
                found = report
            else:
                kept.append(report)
        if found in kept:
            kept.remove(found)
        return found

    def after_failure(self, step: int, grace_s: float = 5.0) -> RankFailed | RankLost | None:
        """Rank 0's own step failed (a collective's error, often), or a peer's connection closed: what the
        peers say about it, each read until it closes or ``grace_s`` passes. A peer whose connection
        closed without reporting an exception left the gang (``RankLost``: its node or process is gone),
        and the others' errors are its consequence; else the first exception raised is the trial's
        failure (``first_failure``); None when every peer is there and silent: the failure is rank 0's own."""
        deadline = self._clock() + grace_s
        said: list[Report] = []
        lost = None
        for rank, line in sorted(self._peers.items()):
            failed = [r for r in self._kept[rank] if r.error is not None]
            try:
                while not failed and (got := line.receive(deadline, self._clock)) is not None:
                    if got.get("error") is not None:
                        failed.append(Report.of(rank, got))
            except (EOFError, ValueError):
                lost = lost or (None if failed else RankLost(rank, step))
            said += failed
        return lost or first_failure(said)

    def cause_of(self, exc: Exception, step: int) -> Exception:
        """What ended the gang's run when rank 0 met ``exc`` at ``step``: rank 0's own error is often a
        collective's, raised because a peer failed or left, and a peer that raised reports its
        exception, then exits, so its closed connection may be met first (sending it the next
        decision) with its report unread behind it. Another rank's exception as it reported it
        (``RankFailed``), a rank that left (``RankLost``), or ``exc`` itself."""
        if isinstance(exc, RankFailed | RankHung):
            return exc
        said = self.after_failure(step)
        if isinstance(exc, RankLost):
            return said if isinstance(said, RankFailed) else exc
        return said or exc

    def uses(self, wait_s: float) -> list[DeviceUse | None]:
        """Every peer's reading of its GPUs, sent as its run ended (``USED``), in rank order: waited for
        up to ``wait_s`` in all; None for a peer that sent none by then (its process gone, or still in a step)."""
        deadline = self._clock() + wait_s
        out: list[DeviceUse | None] = []
        for rank, line in sorted(self._peers.items()):
            found = next((r for r in self._kept[rank] if r.kind == USED), None)
            try:
                while found is None and (got := line.receive(deadline, self._clock)) is not None:
                    report = Report.of(rank, got)
                    if report.kind == USED:
                        found = report
                    else:
                        self._kept[rank].append(report)
            except (EOFError, ValueError):
                pass
            out.append(found.use if found is not None else None)
        return out

    def stalled(self, step: int, waited_s: float) -> RankFailed | RankHung:
        """Rank 0 reached no step boundary for ``waited_s`` (blocked, often, in a collective with a peer
        that never joined it), asked from another thread without taking anything off the lines: a
        peer that reported an exception failed the gang; else every peer that has not reported the
        step is named (none: rank 0 itself is hung)."""
        silent, told = [], []
        for rank, line in sorted(self._peers.items()):
            said = [*self._kept[rank], *(Report.of(rank, obj) for obj in line.peek())]
            told += said
            if max([self._heard[rank], *(r.step for r in said if r.kind == STEP)]) < step:
                silent.append(rank)
        return first_failure(told) or RankHung(silent[0] if silent else 0, step, waited_s, in_step=True, ranks=tuple(silent))

    def send(self, decision: Mapping[str, Any]) -> None:
        """The gang's decision for the step just gathered, to every peer."""
        for rank, line in sorted(self._peers.items()):
            try:
                line.send(decision)
            except OSError:
                raise RankLost(rank, int(decision.get("step", -1))) from None

    def close(self) -> None:
        for line in self._peers.values():
            line.close()


class Peer:
    """A rank other than 0: ``exchange`` its report for the gang's decision once a step."""

    def __init__(self, rank: int, line: _Line, hang_s: float, clock: Callable[[], float]) -> None:
        self.rank, self._line, self.hang_s, self._clock = rank, line, hang_s, clock
        self._kept: list[dict[str, Any]] = []  # decisions that came before the one awaited (rank 0 decides a step ahead)

    @classmethod
    def connect(
        cls, host: str, port: int, rank: int, *, hang_s: float, job: str, connect_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> Peer:
        """Connect to rank 0 (retrying while it is not listening yet, up to ``connect_s``, else
        ``hang_s``) and say which rank of which job this is."""
        wait_s = hang_s if connect_s is None else connect_s
        deadline = clock() + wait_s
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, min(hang_s, deadline - clock())))
                break
            except OSError:
                if clock() >= deadline:
                    raise RankHung(0, 0, wait_s) from None
                time.sleep(0.05)
        line = _Line(sock)
        line.send({"rank": rank, "job": job, "host": socket.gethostname(), "pid": os.getpid()})
        return cls(rank, line, hang_s, clock)

    def report(self, report: Report) -> None:
        """Send a report without waiting for a decision (a failing rank's last word); quiet if rank 0 is gone."""
        try:
            self._line.send(report.to_json())
        except OSError:
            pass

    def told(self, wait_s: float) -> dict[str, Any]:
        """Rank 0's word before training (``Leader.send``): waited for up to ``wait_s``."""
        began = self._clock()
        try:
            said = self._line.receive(began + wait_s, self._clock)
        except (EOFError, OSError, ValueError):
            raise RankLost(0, 0) from None
        if said is None:
            raise RankHung(0, 0, self._clock() - began)
        return said

    def exchange(self, report: Report) -> dict[str, Any]:
        """Send this rank's report; rank 0's decision of the same kind for the same step."""
        try:
            self._line.send(report.to_json())
        except OSError:
            raise RankLost(0, report.step) from None
        return self.decision(report.kind, report.step)

    def decision(self, kind: str, step: int) -> dict[str, Any]:
        """Rank 0's decision of ``kind`` for ``step``: kept, or read (keeping what comes before it)."""
        found = next((d for d in self._kept if (d.get("kind", STEP), d.get("step")) == (kind, step)), None)
        began = self._clock()
        while found is None:
            try:
                got = self._line.receive(began + self.hang_s, self._clock)
            except (EOFError, OSError):
                raise RankLost(0, step) from None
            if got is None:
                raise RankHung(0, step, self._clock() - began)
            if (got.get("kind", STEP), got.get("step")) == (kind, step):
                found = got
            else:
                self._kept.append(got)
        if found in self._kept:
            self._kept.remove(found)
        return found

    def close(self) -> None:
        self._line.close()


def dismiss(gang: GangEnv, hang_s: float) -> None:
    """Rank 0 of a slot that is done: every peer waiting for its next trial is told there is none, and
    exits. A peer that never comes within ``hang_s`` (gone) is not waited for longer."""
    try:
        leader = Leader.open(gang.channel_port, gang.world_size, hang_s=hang_s, job=gang.job_id)
    except RankHung:
        return
    try:
        leader.send({DISMISSED: True})
    except RankLost:
        pass
    finally:
        leader.close()


DISMISSED = "dismissed"  # rank 0's word to a slot's peers: no trial is left to train

FINAL_PARTITION = "final_partition"  # a peer's report whose words are its requests for the final partition: the trial is rejected


class FinalPartitionAsked(RuntimeError):
    """A peer's trainer asked for the final partition (and may have caught the refusal): its run stops."""


class RankFailed(RuntimeError):
    """Another rank's exception, as it reported it: the trial's failure, with that rank's traceback."""

    def __init__(self, rank: int, step: int, text: str, cause: str | None = None) -> None:
        self.rank, self.step, self.traceback, self.cause = rank, step, text, cause
        last = text.strip().splitlines()[-1] if text.strip() else "an exception"
        super().__init__(f"rank {rank} failed after step {step}: {last}")


def report_failure(peer: Peer, step: int, exc: BaseException, cause: str, at: float | None = None) -> None:
    """Tell rank 0 this rank's exception, its failure class and when it was raised (``at``; now unless
    said), without waiting: rank 0 may be blocked in a collective this rank will never join, and is
    freed when this process exits. Quiet if rank 0 is gone."""
    error = "".join(traceback.format_exception(exc))
    peer.report(Report(peer.rank, step, error=error, cause=cause, at=time.time() if at is None else at))


def restored_of(found: GangRestore, checkpoints: GangCheckpoints) -> Restored:
    """A rank's part of the gang's newest complete step as its loop restores it (the gang's own header
    fields left out: the trainer saved none of them), and any other rank's part of it on demand."""

    def state(part: Checkpoint) -> TrainerState:
        return TrainerState(part.params, trainer_extra(part))

    return Restored(found.manifest.step, state(found.own), lambda rank: state(checkpoints.resumed_part(found.manifest, rank)))


def _decision(step: int, due: Due, stop: Stop | None) -> dict[str, Any]:
    return {"kind": STEP, "step": step, "checkpoint": due.checkpoint, "validate": due.validate, "stop": stop.value if stop is not None else None}


def _stop_of(decision: Mapping[str, Any]) -> Stop | None:
    return Stop(decision["stop"]) if decision.get("stop") is not None else None


class Watchdog:
    """Rank 0's clock between step boundaries, on a thread of its own: rank 0 blocked longer than
    ``bound_s`` in its trainer's code (a collective a hung peer never joins waits for torch's own
    timeout, 30 minutes by default) is handed to ``fire`` with the time waited, once. Paused while
    rank 0 waits on the channel itself (``gather`` has its own bound). Up to the first boundary
    (the build, the process group's rendezvous, a first step that compiles) the bound is
    ``first_bound_s``: longer, as a first step may rightly be."""

    def __init__(self, bound_s: float, first_bound_s: float, fire: Callable[[float], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.bound_s, self._fire, self._clock = bound_s, fire, clock
        self._bound = first_bound_s
        self._last: float | None = None  # the last boundary; None: paused
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="parcel-gang-watchdog", daemon=True)

    @classmethod
    def of_gang(cls, bound_s: float, fire: Callable[[float], None]) -> Watchdog:
        """Rank 0's watchdog at the gang's bound (the launcher's signal delay), started; its first step
        may take ten times as long, and never less than ``FIRST_STEP_BOUND_S``."""
        return cls(bound_s, max(10 * bound_s, FIRST_STEP_BOUND_S), fire).start()

    def start(self) -> Watchdog:
        self._last = self._clock()
        self._thread.start()
        return self

    def pause(self) -> None:
        self._last = None

    def resume(self) -> None:
        self._bound = self.bound_s
        self._last = self._clock()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(min(1.0, self.bound_s / 10)):
            last = self._last
            if last is not None and (waited := self._clock() - last) > self._bound:
                self._fire(waited)
                return


class LeaderSide:
    """Rank 0's half of each exchange, called by its run's ``_agreed`` hooks: the gang does what rank 0
    decided, a signal that reached any rank included, and a peer's reported error is the trial's.

    A step ahead: at step s every rank does what rank 0 sent at step s-1, and rank 0 sends the decision
    for step s+1, made from its own state now and the peers' reports on step s-1 (read, not waited
    for, in the steady state). Rank 0's own requeue (its signal) is the gang's at s+1; a peer's
    signal, reported at s, at s+2; a stop that saves nothing (rank 0's rejection) is rank 0's at once
    and the peers' at s+1. The run's first step is decided at once (every peer waits for it), and so
    is each milestone's validation (its pruning decision). ``watch``: rank 0's watchdog, paused
    while it waits on the channel."""

    def __init__(self, leader: Leader, watch: Watchdog | None = None) -> None:
        self.leader, self.watch = leader, watch
        self._ahead: dict[str, Any] | None = None  # the decision sent for the coming step

    def after_step(self, run: Run, step: int, due: Due, stop: Stop | None) -> tuple[Due, Stop | None]:
        self._pause()
        milestone = run.budget.is_milestone(step)
        if self._ahead is None:  # the run's first step: decided now, as rank 0 found it
            now = _decision(step, due, stop)
            self.leader.send(now)
        else:
            now = self._ahead
            self._gathered(step - 1, STEP)
        agreed, agreed_stop = Due(bool(now["checkpoint"]), bool(now["validate"])), _stop_of(now)
        if agreed_stop is None and stop is not None and not stop.saves_first:
            agreed, agreed_stop = stopping_due(stop, milestone), stop  # rank 0's rejection: its own at once
        upcoming = agreed_stop or (stop if stop is not None else (Stop.REQUEUE if self.leader.signalled else None))
        self._ahead = None
        if step < run.budget.steps and (agreed_stop is None or not agreed_stop.saves_first):
            nxt = step + 1
            nxt_due = stopping_due(upcoming, run.budget.is_milestone(nxt)) if upcoming is not None else run.due_after(nxt, saving_now=agreed.checkpoint)
            self._ahead = _decision(nxt, nxt_due, upcoming)
            self.leader.send(self._ahead)
        self._resume()
        return agreed, agreed_stop

    def after_validation(self, step: int, stop: Stop | None) -> Stop | None:
        self._pause()
        self._gathered(step, VALIDATED)  # the peers' reports on the step itself are kept on the way
        self.leader.send({"kind": VALIDATED, "step": step, "stop": stop.value if stop is not None else None})
        self._resume()
        return stop

    def _pause(self) -> None:
        if self.watch is not None:
            self.watch.pause()

    def _resume(self) -> None:
        if self.watch is not None:
            self.watch.resume()  # rank 0's trainer code again, to the next boundary

    def _gathered(self, step: int, kind: str) -> list[Report]:
        reports = self.leader.gather(step, kind)
        if (failed := first_failure(reports)) is not None:
            raise failed
        return reports


class PeerRun(Run):
    """A rank other than 0 of a gang: the same loop, its own part of each checkpoint, and every
    decision (save, validate, stop) rank 0's. It keeps no ledger and scores nothing that counts: rank 0
    records the trial. ``signalled`` says whether the scheduler's signal reached this rank."""

    def __init__(
        self,
        params: Mapping[str, Any],
        seed: int,
        data: TrainingData,
        peer: Peer,
        checkpoints: GangCheckpoints,
        signalled: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(params, seed, data, score=lambda scores: float("nan"))
        self.peer, self.checkpoints, self.signalled = peer, checkpoints, signalled
        self.writer = BackgroundWriter(checkpoints)
        self.hooks: tuple[Callable[[Mapping[str, Any], int], None], ...] = ()  # called after each step (the tests' faults)
        self.final_requests: Callable[[], list[str]] = list  # what this rank's trainer did towards the final partition, in words

    def _restore(self) -> Restored | None:
        found = self.checkpoints.load_latest()
        return None if found is None else restored_of(found, self.checkpoints)

    def _stepped(self, step: int) -> Stop | None:
        for hook in self.hooks:
            hook(self.params, step)
        if asked := self.final_requests():
            raise FinalPartitionAsked("; ".join(asked))  # told to rank 0, which rejects the trial
        return None  # rank 0 decides, in ``_agreed``

    def _agreed(self, step: int, due: Due, stop: Stop | None) -> tuple[Due, Stop | None]:
        decision = self.peer.exchange(Report(self.peer.rank, step, signalled=self.signalled()))
        return Due(bool(decision["checkpoint"]), bool(decision["validate"])), _stop_of(decision)

    def _save(self, step: int, state: TrainerState) -> None:
        self.writer.submit(step, state.arrays, {}, {}, extra=state.scalars)

    def _validated(self, step: int, value: float, final: bool, metrics: Mapping[str, float]) -> Stop | None:
        return None

    def _agreed_after_validation(self, step: int, stop: Stop | None) -> Stop | None:
        return _stop_of(self.peer.exchange(Report(self.peer.rank, step, signalled=self.signalled(), kind=VALIDATED)))
