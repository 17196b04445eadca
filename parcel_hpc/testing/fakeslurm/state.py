"""The fake controller's state on disk: its configuration, its nodes and its jobs.

Owns: the records every fake tool reads and writes (``Config``, ``Node``, ``Job``, ``Run``), the one
lock they take to change them, and the pure rules of the cluster (which pending job may start where,
and why the others wait). Must not: start or signal processes (``controller``), or print what a
real tool prints (``tools``). Stdlib only: every fake tool call is a fresh interpreter.

Layout of a state directory::

    config.json  nodes.json  next_id  lock  ctld.pid  down (slurmctld unreachable)  dbd-down
    active/<raw id>.json   a job the controller still holds (pending, running)
    done/<raw id>.json     a job that ended for good (what only sacct still shows)
    bin/                   the wrappers named sbatch, squeue, ... (``install``)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class State(enum.Enum):
    """The job states the fake produces, spelled as sacct and squeue print them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    REQUEUED = "REQUEUED"

    def is_active(self) -> bool:
        return self in (State.PENDING, State.RUNNING)


# How a run ended when something outside the job ended it, and whether the job is queued again after.
REQUEUES = {State.REQUEUED: True, State.PREEMPTED: True, State.NODE_FAIL: True, State.CANCELLED: False, State.TIMEOUT: False}


@dataclass
class Config:
    """What slurm.conf would say, with time scaled so tests answer in seconds."""

    cluster: str = "fake"
    minute_s: float = 60.0  # seconds of wall time per minute of --time (tests shrink it)
    kill_wait_s: float = 5.0  # KillWait: SIGTERM, then SIGKILL this much later (the dev cluster's 5)
    requeue_delay_s: float = 10.0  # a requeued job's BeginTime after its run ended (the dev cluster ran one again 13 s later)
    partitions: dict[str, dict] = field(
        default_factory=lambda: {
            "low": {"default": True, "tier": 1, "grace_s": 15.0},  # the dev cluster's partitions (PreemptMode=REQUEUE)
            "high": {"default": False, "tier": 10, "grace_s": 0.0},
        }
    )
    max_array_size: int = 1001
    max_job_count: int = 10000
    version: str = "22.05.8"  # the Slurm whose text it prints: 22.05.8, 24.11.5 or 26.05.5 (recorded from each)

    def release(self) -> tuple[int, int]:
        """(year, month) of ``version``: what changed between releases is told by it."""
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def stores_whole_exit_status(self) -> bool:
        return self.release() >= (25, 11)  # before, statuses above 128 are stored modulo 128

    @property
    def per_run_fields(self) -> tuple[str, ...]:
        return ("SLUID", "Restarts") if self.release() >= (26, 5) else ()


@dataclass
class Node:
    name: str
    gpus: int = 4
    state: str = "IDLE"  # IDLE (up), DOWN, DRAIN
    reason: str = ""


@dataclass
class Run:
    """One run of a job: what sacct prints one row (and its steps' rows) for."""

    state: str  # a State value, or "CANCELLED by <uid>"
    exit_code: str  # "<status>:<signal>"
    submit: float
    start: float
    end: float
    node: str
    batch_state: str
    batch_exit: str
    reason: str = "None"
    stepped: bool = False  # srun ran a step (sacct prints a .0 row)


@dataclass
class Job:
    raw: int  # JobIDRaw
    name: str
    script: str  # the batch script's path inside the state directory
    workdir: str
    env: dict[str, str]
    user: str
    uid: int
    submit: float
    array_id: int | None = None  # SLURM_ARRAY_JOB_ID
    task: int | None = None  # SLURM_ARRAY_TASK_ID
    array_tasks: list[int] = field(default_factory=list)  # every task index of the array
    throttle: int = 0  # the array's %N (0: none)
    time_min: float = 60.0
    signal: tuple[str, float, bool] | None = None  # (name, seconds before the limit, to the batch shell too)
    requeue: bool = True  # JobRequeue=1
    partition: str = "low"
    account: str = "parcel"
    qos: str = "normal"
    gpus: int = 0
    cpus: int = 1
    mem_mb: int = 100
    exclusive: bool = False
    nodelist: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    output: str = ""
    error: str = ""
    open_mode: str = "truncate"
    comment: str = ""
    held: bool = False
    state: str = State.PENDING.value
    reason: str = "None"
    begin: float = 0.0
    restarts: int = 0
    node: str = ""
    start: float = 0.0
    end: float = 0.0
    preempt_time: float = 0.0
    ending: str = ""  # the state an outside request ends the current run with (set by a tool, carried out by the controller)
    runs: list[Run] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        """As squeue --array and sacct print it: 12, or 55_3 for an array task."""
        return f"{self.array_id}_{self.task}" if self.array_id is not None else str(self.raw)

    def matches(self, ident: str) -> bool:
        """Whether ``ident`` (12, 55 for a whole array, 55_3, or a raw id) names this job."""
        head, _, task = ident.partition("_")
        if task:
            return self.array_id is not None and head == str(self.array_id) and task == str(self.task)
        return head in (str(self.raw), str(self.array_id))

    @property
    def status(self) -> State:
        return State(self.state)

    @classmethod
    def from_json(cls, data: dict) -> Job:
        runs = [Run(**r) for r in data.pop("runs", [])]
        signal = data.pop("signal", None)
        return cls(**data, runs=runs, signal=tuple(signal) if signal else None)


class Store:
    """A state directory. Every change is made under ``locked()``; reads of one file need no lock
    (each is replaced whole by a rename)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def config(self) -> Config:
        return Config(**json.loads((self.root / "config.json").read_text()))

    def nodes(self) -> list[Node]:
        return [Node(**n) for n in json.loads((self.root / "nodes.json").read_text())]

    def save_nodes(self, nodes: Sequence[Node]) -> None:
        _write(self.root / "nodes.json", [dataclasses.asdict(n) for n in nodes])

    def create(self, config: Config, nodes: Sequence[Node]) -> None:
        for sub in ("active", "done", "bin", "scripts", "steps", "etc"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        _write(self.root / "config.json", dataclasses.asdict(config))
        self.save_nodes(nodes)
        (self.root / "next_id").write_text("1")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / "lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def new_ids(self, count: int) -> list[int]:
        """``count`` fresh raw job ids (under the lock)."""
        first = int((self.root / "next_id").read_text())
        (self.root / "next_id").write_text(str(first + count))
        return list(range(first, first + count))

    def active(self) -> list[Job]:
        return self._read(self.root / "active")

    def all_jobs(self) -> list[Job]:
        return sorted(self._read(self.root / "done") + self.active(), key=lambda j: j.raw)

    def save(self, job: Job) -> None:
        data = dataclasses.asdict(job)
        if job.status.is_active():
            _write(self.root / "active" / f"{job.raw}.json", data)
        else:
            _write(self.root / "done" / f"{job.raw}.json", data)
            with contextlib.suppress(FileNotFoundError):
                (self.root / "active" / f"{job.raw}.json").unlink()

    def flag(self, name: str) -> bool:
        return (self.root / name).exists()

    def _read(self, folder: Path) -> list[Job]:
        out = []
        for path in folder.glob("*.json"):
            try:
                out.append(Job.from_json(json.loads(path.read_text())))
            except FileNotFoundError:  # moved to done/ between the listing and the read
                continue
        return out


def _write(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# --- the cluster's rules (pure) -------------------------------------------------------------------


def used_gpus(node: str, jobs: Sequence[Job]) -> int:
    return sum(j.gpus for j in jobs if j.status is State.RUNNING and j.node == node)


def wait_reason(job: Job, jobs: Sequence[Job], nodes: Sequence[Node], now: float) -> str:
    """Why a pending job cannot start yet, as squeue's Reason says it; "" when it can."""
    if job.held:
        return "JobHeldUser"
    if job.begin > now:
        return "BeginTime"
    if job.throttle and job.array_id is not None:
        running = sum(1 for j in jobs if j.array_id == job.array_id and j.status is State.RUNNING)
        if running >= job.throttle:
            return "JobArrayTaskLimit"
    candidates = [n for n in nodes if (not job.nodelist or n.name in job.nodelist) and n.name not in job.exclude]
    if not any(n.state == "IDLE" for n in candidates):
        return "ReqNodeNotAvail"
    return "" if place(job, jobs, nodes) else "Resources"


def place(job: Job, jobs: Sequence[Job], nodes: Sequence[Node]) -> str:
    """The node a pending job starts on now ("" if none has room): the least used that fits."""
    fits = []
    for n in nodes:
        if n.state != "IDLE" or (job.nodelist and n.name not in job.nodelist) or n.name in job.exclude:
            continue
        here = [j for j in jobs if j.status is State.RUNNING and j.node == n.name]
        if job.exclusive and here or any(j.exclusive for j in here):
            continue
        if job.gpus <= n.gpus - used_gpus(n.name, jobs):
            fits.append((len(here), n.name))
    return min(fits)[1] if fits else ""


def preemptable(job: Job, jobs: Sequence[Job], nodes: Sequence[Node], tiers: dict[str, int]) -> list[Job]:
    """The running jobs of lower partitions that ``job`` preempts to start (partition_prio): on the
    first node it could use, every lower-tier job there (all of them when it wants the node whole)."""
    mine = tiers.get(job.partition, 0)
    for n in nodes:
        if n.state != "IDLE" or (job.nodelist and n.name not in job.nodelist) or n.name in job.exclude:
            continue
        lower = [j for j in jobs if j.status is State.RUNNING and j.node == n.name and tiers.get(j.partition, 0) < mine and not j.ending]
        if lower:
            return lower
    return []


def now() -> float:
    return time.time()
