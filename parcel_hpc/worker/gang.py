"""The gang's control channel: rank 0 and its peers agree at every step boundary (issue 50).

Rank 0 listens on a port of its host; every other rank connects once when its attempt starts and
says which rank it is. After each step every peer reports to rank 0 (the step, whether the
scheduler's signal reached it, an error with its traceback); rank 0 gathers the reports with its
own, decides for the whole gang and sends every peer the one decision, so all ranks save, validate
and stop at the same step boundary (a signal that reached any rank is the gang's). Determined's
distributed context does the same with ZeroMQ; this is plain TCP, one JSON object a line.

A peer that reports nothing within ``hang_s`` while rank 0 waits is hung: ``gather`` raises
``RankHung`` naming it and the step, and rank 0 ends the gang; a peer that hears no decision within
``hang_s`` raises ``RankHung`` for rank 0. A closed connection (a rank killed, its node gone) is
``RankLost``. The bound is the caller's: the runtime passes the contract's step timeout.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.checkpoints.gang import GANG_KEY, GangCheckpoints, GangRestore
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.trainer import TrainerState, TrainingData
from parcel_hpc.trainer.run import Due, Restored, Run, Stop, stopping_due

_LINE_LIMIT = 1 << 20  # a report or a decision is small; a longer line is a broken peer
_PORTS = (20000, 40000)  # where a gang's master port is drawn from, by its job id


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

    @classmethod
    def of_job(cls, job_id: str, rank: int, world_size: int, local_rank: int, local_world_size: int, hosts: list[str]) -> GangEnv:
        """From the scheduler's job (submitit's ``JobEnvironment``): the port drawn from the job id, so
        every rank of the job, and a requeued run of it, names the same one without talking first."""
        low, high = _PORTS
        port = low + zlib.crc32(job_id.encode()) % (high - low - 1)
        return cls(rank, world_size, local_rank, local_world_size, hosts[0], port)

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

    def peek(self) -> dict[str, Any] | None | EOFError:
        """Without taking it (another thread may be reading this line later): the next object if one
        has arrived whole, None if not yet, ``EOFError`` if the peer closed."""
        waiting = b""
        try:
            if select.select([self.sock], [], [], 0)[0]:  # never waits: the socket's own timeout would
                waiting = self.sock.recv(_LINE_LIMIT, socket.MSG_PEEK)
                if not waiting and b"\n" not in self.buffer:
                    return EOFError()  # readable with nothing to read: the peer closed
        except OSError:
            return EOFError()
        line, newline, _ = (self.buffer + waiting).partition(b"\n")
        return json.loads(line) if newline else None

    def close(self) -> None:
        self.sock.close()


class Leader:
    """Rank 0's end: every peer connected, then ``gather`` and ``send`` once a step."""

    def __init__(self, peers: dict[int, _Line], hang_s: float, clock: Callable[[], float], where: Mapping[int, tuple[str, int]] | None = None) -> None:
        self._peers, self.hang_s, self._clock = peers, hang_s, clock
        self.where = dict(where or {})  # rank -> (host, pid) as its hello said: a hung rank on this host is ended by its pid

    @classmethod
    def open(cls, port: int, world_size: int, *, hang_s: float, clock: Callable[[], float] = time.monotonic) -> Leader:
        """Listen on ``port`` (every interface: peers on other nodes reach it by the host's name) until
        all ``world_size - 1`` peers said hello; a peer that never came within ``hang_s`` is ``RankHung`` at step 0."""
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
                if not isinstance(rank, int) or not 0 < rank < world_size or rank in peers:
                    line.close()  # not one of ours (a port scan, a stale peer of another gang)
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

    def gather(self, step: int) -> list[Report]:
        """Every peer's report for ``step``, in rank order."""
        reports = []
        for rank, line in sorted(self._peers.items()):
            began = self._clock()
            try:
                got = line.receive(began + self.hang_s, self._clock)
            except EOFError:
                raise RankLost(rank, step) from None
            if got is None:
                raise RankHung(rank, step, self._clock() - began)
            reports.append(Report(rank, int(got["step"]), bool(got.get("signalled")), got.get("error"), got.get("cause")))
        return reports

    def after_failure(self, step: int, grace_s: float = 5.0) -> RankFailed | RankLost | None:
        """Rank 0's own step failed (a collective's error, often): what its peers say about it. A peer's
        reported exception is the trial's failure (``RankFailed``); a peer whose connection closed
        without one left the gang (``RankLost``: its node or process is gone); None when every peer is
        there and silent, so the failure is rank 0's own."""
        deadline = self._clock() + grace_s
        lost = None
        for rank, line in sorted(self._peers.items()):
            try:
                while (got := line.receive(deadline, self._clock)) is not None:
                    if got.get("error") is not None:
                        return RankFailed(rank, int(got.get("step", step)), str(got["error"]), got.get("cause"))
            except (EOFError, ValueError):
                lost = lost or RankLost(rank, step)
        return lost

    def stalled(self, step: int, waited_s: float) -> RankFailed | RankHung:
        """Rank 0 reached no step boundary for ``waited_s`` (blocked, often, in a collective with a peer
        that never joined it), asked from another thread without taking anything off the lines: a
        peer that reported an exception failed the gang; else every peer that has not reported the
        step is named (none: rank 0 itself is hung)."""
        silent = []
        for rank, line in sorted(self._peers.items()):
            said = line.peek()
            if isinstance(said, dict) and said.get("error") is not None:
                return RankFailed(rank, int(said.get("step", step)), str(said["error"]), said.get("cause"))
            if said is None:
                silent.append(rank)
        return RankHung(silent[0] if silent else 0, step, waited_s, in_step=True, ranks=tuple(silent))

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

    @classmethod
    def connect(cls, host: str, port: int, rank: int, *, hang_s: float, clock: Callable[[], float] = time.monotonic) -> Peer:
        """Connect to rank 0 (retrying while it is not listening yet) and say which rank this is."""
        deadline = clock() + hang_s
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, deadline - clock()))
                break
            except OSError:
                if clock() >= deadline:
                    raise RankHung(0, 0, hang_s) from None
                time.sleep(0.05)
        line = _Line(sock)
        line.send({"rank": rank, "host": socket.gethostname(), "pid": os.getpid()})
        return cls(rank, line, hang_s, clock)

    def report(self, report: Report) -> None:
        """Send a report without waiting for a decision (a failing rank's last word); quiet if rank 0 is gone."""
        try:
            self._line.send({"step": report.step, "signalled": report.signalled, "error": report.error, "cause": report.cause})
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
        """Send this rank's report; the gang's decision for the step."""
        try:
            self._line.send({"step": report.step, "signalled": report.signalled, "error": report.error, "cause": report.cause})
            began = self._clock()
            decision = self._line.receive(began + self.hang_s, self._clock)
        except (EOFError, OSError):
            raise RankLost(0, report.step) from None
        if decision is None:
            raise RankHung(0, report.step, self._clock() - began)
        return decision

    def close(self) -> None:
        self._line.close()


FINAL_PARTITION = "final_partition"  # a peer's report whose words are its requests for the final partition: the trial is rejected


class FinalPartitionAsked(RuntimeError):
    """A peer's trainer asked for the final partition (and may have caught the refusal): its run stops."""


class RankFailed(RuntimeError):
    """Another rank's exception, as it reported it: the trial's failure, with that rank's traceback."""

    def __init__(self, rank: int, step: int, text: str, cause: str | None = None) -> None:
        self.rank, self.step, self.traceback, self.cause = rank, step, text, cause
        last = text.strip().splitlines()[-1] if text.strip() else "an exception"
        super().__init__(f"rank {rank} failed after step {step}: {last}")


def report_failure(peer: Peer, step: int, exc: BaseException, cause: str) -> None:
    """Tell rank 0 this rank's exception and its failure class (its traceback is the trial's failure),
    without waiting: rank 0 may be blocked in a collective this rank will never join, and is freed
    when this process exits. Quiet if rank 0 is gone."""
    peer.report(Report(peer.rank, step, error="".join(traceback.format_exception(exc)), cause=cause))


def restored_of(found: GangRestore) -> Restored:
    """A rank's part of the gang's newest complete step as its loop restores it (the gang's own header
    fields left out: the trainer saved none of them)."""
    extra = {k: v for k, v in (found.own.extra or {}).items() if k != GANG_KEY}
    return Restored(found.manifest.step, TrainerState(found.own.params, extra))


def _decision(step: int, due: Due, stop: Stop | None) -> dict[str, Any]:
    return {"step": step, "checkpoint": due.checkpoint, "validate": due.validate, "stop": stop.value if stop is not None else None}


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
    ``watch``: rank 0's watchdog, paused while it waits on the channel."""

    def __init__(self, leader: Leader, watch: Watchdog | None = None) -> None:
        self.leader, self.watch = leader, watch

    def after_step(self, step: int, due: Due, stop: Stop | None, milestone: bool) -> tuple[Due, Stop | None]:
        reports = self._gathered(step)
        if stop is None and any(r.signalled for r in reports):
            stop = Stop.REQUEUE  # the scheduler's signal reached a peer first: the gang's all the same
            due = stopping_due(stop, milestone)
        self._send(_decision(step, due, stop))
        return due, stop

    def after_validation(self, step: int, stop: Stop | None) -> Stop | None:
        self._gathered(step)
        self._send({"step": step, "stop": stop.value if stop is not None else None})
        return stop

    def _send(self, decision: Mapping[str, Any]) -> None:
        self.leader.send(decision)
        if self.watch is not None:
            self.watch.resume()  # rank 0's trainer code again, to the next boundary

    def _gathered(self, step: int) -> list[Report]:
        if self.watch is not None:
            self.watch.pause()
        reports = self.leader.gather(step)
        failed = next((r for r in reports if r.error is not None), None)
        if failed is not None:
            raise RankFailed(failed.rank, failed.step, str(failed.error), failed.cause)
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
        return None if found is None else restored_of(found)

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
        return _stop_of(self.peer.exchange(Report(self.peer.rank, step, signalled=self.signalled())))
