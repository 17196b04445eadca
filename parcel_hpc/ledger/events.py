"""The typed events of a trial's history: what kinds exist, why attempts end, and the line format.

Owns ``EventKind``, ``Cause``, one frozen payload class per kind (validated at birth: an ``ended``
event saying ``completed`` without a finite metric cannot exist), the ``Event`` envelope, and the
conversion to and from one JSON line. Must not write files (``journal.py`` does) or decide a
trial's state (``records.fold`` does).

A journal line is flat: ``{"kind", "t", "writer", "seq", "attempt", **payload}``.
"""

from __future__ import annotations

import enum
import functools
import math
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from parcel_hpc.errors import CorruptRecord
from parcel_hpc.governance.metric import FoldScores
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger.states import AttemptEnd, TrialState


class EventKind(str, enum.Enum):
    SUBMITTED = "submitted"  # a launcher handed the trial to the scheduler
    ADMISSION = "admission"  # a launch refused the trial against the frozen contract
    STARTED = "started"  # a worker attempt began, with the scheduler's facts
    ADMITTED = "admitted"  # ... and passed its own check: the digests of what it actually opened
    RESUMED = "resumed"  # ... from a checkpoint at this step
    MILESTONE = "milestone"  # a validation value (a milestone, or the final step)
    CHECKPOINT_SKIPPED = "checkpoint_skipped"  # a corrupt checkpoint was passed over on resume
    DEVICE_USE = "device_use"  # what the attempt used of its GPUs, just before it ended
    ENDED = "ended"  # the attempt itself said how it ended
    RESOLVED = "resolved"  # an owner of the search said how a silent attempt ended, from scheduler facts
    QUARANTINED = "quarantined"  # the trial shared a checkpoint directory: its attempts so far are tainted
    GAVE_UP = "gave_up"  # a retry limit ended the trial
    CANCELLED = "cancelled"  # an owner cancelled the trial (recorded before its job is signalled)
    ACCOUNTED = "accounted"  # the scheduler filed a run of one of its jobs: the run's start, end and hours


_EXECUTOR_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class Executor(str):
    """Where a trial's jobs run: the name its scheduler backend declares (``scheduler/registry.py``
    holds one backend per name). A name, not an Enum: the ledger is below the schedulers, and a new
    backend adds no member here. A journal naming a backend this installation lacks is refused where
    a backend is asked for it (``registry.backend_of``), in one line."""

    __slots__ = ()

    def __new__(cls, name: str) -> Executor:
        if not isinstance(name, str) or not _EXECUTOR_NAME.fullmatch(name):
            raise ValueError(f"executor {name!r} is not a backend's name (a lowercase letter, then lowercase letters, digits or _)")
        return super().__new__(cls, name)


class FenceLayer(str, enum.Enum):
    """Which layers of the final partition's fence held a process that ran trainer code (``parcel_hpc.fence``)."""

    KERNEL = "kernel"  # Landlock, the audit hook recording
    AUDIT = "audit"  # the audit hook alone: the kernel had no usable Landlock


class Cause(str, enum.Enum):
    """Why an attempt ended without a plain result, or why a trial was given up."""

    # Infrastructure: the scheduler or the machine ended it; retried from the trial's checkpoint.
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"
    CANCELLED = "cancelled"  # a system or hand scancel: an interruption, retried like a preemption
    LOST = "lost"  # the job vanished without saying how
    REQUEUED_BY_SCHEDULER = "requeued_by_scheduler"  # SLURM requeued it before the worker could say so
    PREVIOUS_ATTEMPT_ALIVE = "previous_attempt_alive"  # an older attempt still held the directory
    SUPERSEDED = "superseded"  # a newer attempt of the same trial took over: not an interruption
    NO_SPACE = "no_space"  # the checkpoint or search filesystem is full (ENOSPC, EDQUOT): not the design's fault
    RANK_LOST = "rank_lost"  # a rank of the trial's gang left it (its process or node gone): the gang is requeued whole
    # Training failures: retried once; the same class twice is a reproducible result about the design.
    EXCEPTION = "exception"
    DIVERGED = "diverged"
    OUT_OF_MEMORY = "out_of_memory"
    UNSAVABLE_STATE = "unsavable_state"  # the trainer's state is not arrays and JSON scalars
    INVALID_PREDICTIONS = "invalid_predictions"  # the trainer's predictions are not one probability per example
    DEVICES_NOT_GRANTED = "devices_not_granted"  # the trainer asked for more GPUs than the attempt was granted
    RANK_HUNG = "rank_hung"  # a rank of the gang reached no step boundary within the bound while the others waited
    # Governance.
    DRIFT = "drift"  # the worker's environment differs from the contract: nothing ran, the trial stays queued
    CHECKPOINT_COLLISION = "checkpoint_collision"  # quarantine: two trials on one checkpoint prefix
    RETRIES_EXHAUSTED = "retries_exhausted"
    CANCELLED_BY_OWNER = "cancelled_by_owner"  # `parcel-hpc cancel`: never retried or resubmitted

    def is_training_failure(self) -> bool:
        return self in (
            Cause.EXCEPTION,
            Cause.DIVERGED,
            Cause.OUT_OF_MEMORY,
            Cause.UNSAVABLE_STATE,
            Cause.INVALID_PREDICTIONS,
            Cause.DEVICES_NOT_GRANTED,
            Cause.RANK_HUNG,
        )

    def is_infrastructure(self) -> bool:
        return self in _INFRASTRUCTURE

    def counts_as_interruption(self) -> bool:
        """Spends a retry: an infrastructure ending that was not a newer attempt taking over."""
        return self.is_infrastructure() and self is not Cause.SUPERSEDED

    def interrupts(self) -> bool:
        """Ends an attempt without a result and without a word on the design: the infrastructure,
        or its owner's cancel (a cancelled trial's running attempt is interrupted, never failed)."""
        return self.is_infrastructure() or self is Cause.CANCELLED_BY_OWNER


_INFRASTRUCTURE = frozenset(
    {
        Cause.PREEMPTED,
        Cause.TIMEOUT,
        Cause.NODE_FAIL,
        Cause.CANCELLED,
        Cause.LOST,
        Cause.REQUEUED_BY_SCHEDULER,
        Cause.PREVIOUS_ATTEMPT_ALIVE,
        Cause.SUPERSEDED,
        Cause.NO_SPACE,
        Cause.RANK_LOST,
    }
)


# --- payloads, one per kind ------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    job_id: str
    executor: Executor
    launch_id: str
    exclude_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class AdmissionRefused:
    outcome: Outcome  # reject:<field>
    launch_id: str

    def __post_init__(self) -> None:
        if not self.outcome.is_reject:
            raise ValueError(f"an admission event records a refusal, not {self.outcome!r}")


@dataclass(frozen=True)
class Started:
    """The scheduler's facts about where an attempt runs, read once from its environment."""

    executor: Executor | None = None  # its backend (None: not said, read as the embedded default's: ``registry.backend_of``)
    job_id: str = ""  # as submitted: "123" or "123_4" for an array task
    raw_job_id: str = ""  # SLURM_JOB_ID (differs from job_id for array tasks)
    node: str = ""
    host: str = ""
    pid: int = 0
    restart_count: int = 0  # SLURM_RESTART_COUNT
    cuda_visible_devices: str = ""
    gpus: int | None = None  # GPUs the scheduler allocated to it (None: not said, journals before it was recorded)
    process_started: float | None = None  # when its job's worker process started (epoch s; None: not said): start-up runs from here


@dataclass(frozen=True)
class Admitted:
    """Digests the worker computed itself from the files and code it opened (the lineage's "on what data")."""

    snapshot_digest: str
    split_digest: str
    image_digest: str
    trainer_digest: str
    fence: FenceLayer | None = None  # the final partition's fence around its trainer code (None: recorded before fences had layers)


@dataclass(frozen=True)
class Resumed:
    step: int
    exact: bool = True  # False: under a declared train.resume_tolerance, the resumed run may differ from an uninterrupted one
    fold: int | None = None  # the fold run of a K-fold trial that resumed (None: a trial without folds)


@dataclass(frozen=True)
class Milestone:
    step: int
    value: float
    is_milestone: bool = True  # False: the final step off the milestone grid (never a peer)
    train: Mapping[str, float] | None = None  # the trainer's metrics of this step (loss, ...)
    fold: int | None = None  # the fold run of a K-fold trial this value is of (None: a trial without folds)


@dataclass(frozen=True)
class DeviceUse:
    """What an attempt used of the devices it was granted, read by its worker (``worker/devices.py``)."""

    devices: tuple[str, ...] = ()  # one name per granted GPU ("NVIDIA H200"); ("cpu",) when it was granted none
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated, the largest of its devices (None: not read)
    utilization: float | None = None  # mean GPU utilization in 0..1 over NVML's samples (None: NVML did not answer)
    samples: int = 0  # NVML readings behind ``utilization``
    frameworks: Mapping[str, str] | None = None  # the versions the trainer ran with: {"torch": "2.13.0+cpu", "cuda": "12.8"}
    # A gang's attempt (issue 50): each rank's own reading, rank 0 first, None where a rank told none
    # (its process gone); the fields above are the whole gang's. Empty for an attempt of one rank.
    rank_utilization: tuple[float | None, ...] = ()
    rank_samples: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError('a device use names its devices: ("cpu",) when the attempt was granted no GPU')
        if self.utilization is not None and not 0.0 <= self.utilization <= 1.0:
            raise ValueError(f"utilization is a fraction in 0..1, not {self.utilization!r}")
        if (self.utilization is None) != (self.samples == 0):
            raise ValueError(f"a utilization is the mean of its samples: {self.utilization!r} from {self.samples} samples")
        if self.peak_memory_bytes is not None and self.peak_memory_bytes < 0:
            raise ValueError(f"peak memory is bytes, not {self.peak_memory_bytes!r}")
        if len(self.rank_utilization) != len(self.rank_samples) or any((u is None) != (n == 0) for u, n in zip(self.rank_utilization, self.rank_samples)):
            raise ValueError(f"each rank's utilization is the mean of its samples: {self.rank_utilization!r} from {self.rank_samples!r}")
        if any(u is not None and not 0.0 <= u <= 1.0 for u in self.rank_utilization):
            raise ValueError(f"a rank's utilization is a fraction in 0..1, not one of {self.rank_utilization!r}")

    @classmethod
    def of_gang(cls, ranks: Sequence[DeviceUse | None], gpus_per_rank: int) -> DeviceUse:
        """A gang's attempt from each rank's own record (rank 0 first; None: a rank that told none,
        its GPUs unknown and unread): the gang's devices, its largest peak, its mean over every reading."""
        told = [r for r in ranks if r is not None]
        devices = tuple(d for r in ranks for d in (r.devices if r is not None else ("unknown",) * max(1, gpus_per_rank)))
        if gpus_per_rank == 0:
            return cls(("cpu",), frameworks=told[0].frameworks if told else None)  # no GPU: nothing per rank to read
        samples = tuple(r.samples if r is not None else 0 for r in ranks)
        utilization = tuple(r.utilization if r is not None else None for r in ranks)
        total = sum(samples)
        mean = round(sum(u * n for u, n in zip(utilization, samples) if u is not None) / total, 4) if total else None
        peaks = [r.peak_memory_bytes for r in told if r.peak_memory_bytes is not None]
        frameworks = told[0].frameworks if told else None
        return cls(devices, max(peaks, default=None), mean, total, frameworks, utilization, samples)

    def of_rank(self, rank: int) -> DeviceUse | None:
        """One rank's reading of a gang's attempt (None: an attempt of one rank, or no such rank)."""
        if not 0 <= rank < len(self.rank_utilization):
            return None
        share = len(self.devices) // len(self.rank_utilization)
        return DeviceUse(self.devices[rank * share : (rank + 1) * share] or ("unknown",), None, self.rank_utilization[rank], self.rank_samples[rank])


@dataclass(frozen=True)
class Accounted:
    """The scheduler's own record of one run of a job the trial was submitted in, once its
    accounting filed the run in full (sacct): what the search's spend settles that run at. Written
    by whoever reads sacct for a search it owns (the launch's follower, ``sync``, ``resubmit``);
    a later record of the same run (slurmdbd rewrote it) replaces it."""

    job_id: str  # as submitted: "123" or "123_4"
    run: int  # 0: the job's first run; n: its run after the n-th requeue (an attempt's restart_count)
    start: int  # epoch seconds, the scheduler's clock
    end: int
    elapsed_s: int  # what the scheduler charged (ElapsedRaw): end - start, less any time suspended
    gpus: int  # what it allocated (AllocTRES gres/gpu)
    cpus: int
    node: str = ""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("an accounted run names its job")
        for name in ("run", "start", "end", "elapsed_s", "gpus", "cpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"an accounted run's {name} is a non-negative integer, not {value!r}")
        if self.end < self.start or self.elapsed_s > self.end - self.start:
            raise ValueError(f"run {self.run} of job {self.job_id}: {self.elapsed_s} s charged between {self.start} and {self.end} cannot be")

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.run)


@dataclass(frozen=True)
class CheckpointSkipped:
    path: str
    reason: str


@dataclass(frozen=True)
class Ended:
    """How an attempt ended: said by the attempt (``ended``) or resolved for it (``resolved``)."""

    how: AttemptEnd
    cause: Cause | None = None
    step: int | None = None
    metric: float | None = None  # completed: the final validation value (a K-fold trial's: the mean over its folds)
    folds: tuple[float, ...] = ()  # completed, a K-fold trial: each fold run's final validation value, in fold order
    value: float | None = None  # pruned: the value at the milestone
    milestone: int | None = None  # pruned: where
    final: bool = False  # failed: the same class failed before, so this failure is the result
    outcome: Outcome | None = None  # rejected: reject:<field>; budget_exhausted: hold:budget
    reason: str = ""  # for people: the prune rule, the quarantine, the budget overshoot
    message: str = ""  # the error text of a failure, or who resolved it
    job_id: str = ""
    error_type: str = ""  # failed: the exception's class name
    traceback: str = ""  # failed: the worker's traceback (``parcel-hpc logs`` prints it)
    programs: tuple[str, ...] = ()  # torch.compile's programs the fence let it start, each with its count ("g++ x14")

    def __post_init__(self) -> None:
        how, cause = self.how, self.cause
        if how is AttemptEnd.COMPLETED and (self.metric is None or not math.isfinite(self.metric)):
            raise ValueError(f"a completed attempt carries a finite metric, not {self.metric!r}")
        if how is not AttemptEnd.COMPLETED and self.metric is not None:
            raise ValueError(f"only a completed attempt carries a metric ({how.value} has {self.metric!r})")
        if self.folds and self.metric != FoldScores(self.folds).mean:
            raise ValueError(f"a K-fold attempt's metric is the mean over its folds {self.folds!r}, not {self.metric!r}")
        if how is AttemptEnd.FAILED and (cause is None or not cause.is_training_failure()):
            raise ValueError(f"a failed attempt names its failure class, not {cause!r}")
        if how is AttemptEnd.INTERRUPTED and (cause is None or not cause.interrupts()):
            raise ValueError(f"an interrupted attempt names an infrastructure cause or its owner's cancel, not {cause!r}")
        if how is AttemptEnd.LOST and (cause is None or not cause.is_infrastructure()):
            raise ValueError(f"a lost attempt names an infrastructure cause, not {cause!r}")
        if how is AttemptEnd.REJECTED and (self.outcome is None or not self.outcome.is_reject):
            raise ValueError(f"a rejected attempt names its outcome reject:<field>, not {self.outcome!r}")
        if how is AttemptEnd.REJECTED and cause not in (None, Cause.DRIFT):
            raise ValueError(f"a rejected attempt's cause is drift or none, not {cause!r}")
        if cause is Cause.DRIFT and how is not AttemptEnd.REJECTED:
            raise ValueError(f"only a rejected attempt is drift, not {how.value}")
        if how is AttemptEnd.QUARANTINED and cause is not Cause.CHECKPOINT_COLLISION:
            raise ValueError(f"a quarantined attempt's cause is checkpoint_collision, not {cause!r}")


_VOLATILE = (
    re.compile(r"(['\"])(?:(?!\1).)*\1"),  # quoted values: a parameter's value, a key, a path
    re.compile(r"(?:[A-Za-z]:)?(?:[\w.~-]*/)+[\w.-]*"),  # paths
    re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{8,}\b"),  # addresses, hex ids
    re.compile(r"[-+]?\d+(?:[._:]\d+)*\.?(?:[eE][-+]?\d+)?"),  # numbers, job ids (123_4), times (12:30)
)
# Hex ids and numbers take one mark: a run of 8 or more digits is both (9999993 + 7 is 10000000), and
# a hex id may hold no letter, so two marks would tell one bug's trials apart by the length of a number.
_MARKS = ("'…'", "<path>", "<n>", "<n>")


def normalized_message(message: str) -> str:
    """An error message with what varies between trials of one bug blanked out (quoted values,
    paths, hex ids, numbers): two trials failing alike give the same text (pure)."""
    text = " ".join(message.split())
    for pattern, mark in zip(_VOLATILE, _MARKS):
        text = pattern.sub(mark, text)
    return text


@dataclass(frozen=True)
class FailureSignature:
    """What makes two failures the same failure: class, exception type, normalized message."""

    cause: Cause
    error_type: str
    message: str  # normalized_message of the error text after its "Type: " prefix

    @classmethod
    def of(cls, cause: Cause, error_type: str, message: str) -> FailureSignature:
        """From an attempt's facts; ``message`` as the worker writes it ("Type: text")."""
        text = message.split(": ", 1)[1] if error_type and message.startswith(f"{error_type}: ") else message
        return cls(cause, error_type, normalized_message(text))

    def __str__(self) -> str:
        return " ".join(part for part in (self.cause.value, self.error_type, self.message) if part)


@dataclass(frozen=True)
class Quarantined:
    reason: str
    attempts_upto: int  # attempts numbered up to this ran in the shared directory
    moved_to: str = ""
    with_trials: tuple[str, ...] = ()


@dataclass(frozen=True)
class GaveUp:
    cause: Cause
    reason: str  # which limit, with the numbers
    state: TrialState = TrialState.FAILED


@dataclass(frozen=True)
class Cancelled:
    by: str  # the user who ran `parcel-hpc cancel`
    reason: str
    whole_search: bool = False  # the search was cancelled, not only this trial


Payload = (
    Submitted
    | AdmissionRefused
    | Started
    | Admitted
    | Resumed
    | Milestone
    | CheckpointSkipped
    | DeviceUse
    | Ended
    | Quarantined
    | GaveUp
    | Cancelled
    | Accounted
)

PAYLOADS: Mapping[EventKind, type] = {
    EventKind.SUBMITTED: Submitted,
    EventKind.ADMISSION: AdmissionRefused,
    EventKind.STARTED: Started,
    EventKind.ADMITTED: Admitted,
    EventKind.RESUMED: Resumed,
    EventKind.MILESTONE: Milestone,
    EventKind.CHECKPOINT_SKIPPED: CheckpointSkipped,
    EventKind.DEVICE_USE: DeviceUse,
    EventKind.ENDED: Ended,
    EventKind.RESOLVED: Ended,
    EventKind.QUARANTINED: Quarantined,
    EventKind.GAVE_UP: GaveUp,
    EventKind.CANCELLED: Cancelled,
    EventKind.ACCOUNTED: Accounted,
}
_ENUM_FIELDS: Mapping[str, Callable[[Any], Any]] = {
    "how": AttemptEnd,
    "cause": Cause,
    "state": TrialState,
    "executor": Executor,
    "outcome": Outcome.parse,
    "fence": FenceLayer,
}
_TUPLE_FIELDS = ("exclude_nodes", "with_trials", "devices", "programs", "folds", "rank_utilization", "rank_samples")


def encode_payload(data: Any, *, drop_empty: bool) -> dict:
    """A payload dataclass as flat JSON values: Enums by value, outcomes as their token, tuples as
    lists; ``drop_empty`` leaves out None, "" and () (their defaults) to keep journal lines short."""
    out = {}
    cls: type = type(data)
    for k in field_names(cls):
        v = getattr(data, k)
        if drop_empty and (v is None or v == "" or v == ()):
            continue
        out[k] = v.value if isinstance(v, enum.Enum) else str(v) if isinstance(v, Outcome) else list(v) if isinstance(v, tuple) else v
    return out


@functools.cache
def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, looked up once: ``fields`` is slow, and a status folds every event."""
    return tuple(f.name for f in fields(cls))


def decode_payload(payload_cls: type, obj: Mapping[str, Any], enums: Mapping[str, Callable[[Any], Any]], tuples: Sequence[str]) -> Any:
    """The inverse of ``encode_payload``: absent fields take their defaults. A value of the wrong
    type for its field (a job id that is a number, a step that is NaN or past 64 bits, a list where
    text belongs) is a TypeError: JSON says nothing of the types a line must hold."""
    values = {}
    checks = field_checks(payload_cls)
    for name in field_names(payload_cls):
        if name not in obj:
            continue
        v = obj[name]
        if name in enums:
            v = enums[name](v)
        elif name in tuples:
            if not isinstance(v, list | tuple):
                raise TypeError(f"{name} is {v!r:.80}, not a list")
            v = tuple(v)
        check = checks.get(name)
        if check is not None and not check(v):
            raise TypeError(f"{name} is {v!r:.80}, not {payload_cls.__annotations__[name]}")
        values[name] = v
    return payload_cls(**values)


def is_int(v: Any) -> bool:
    """A whole number a record may hold: an int, not a bool, within 64 bits (Arrow's and numpy's)."""
    return type(v) is int and -(2**63) <= v < 2**63


def is_number(v: Any) -> bool:
    """A finite number (an int within 64 bits, or a finite float)."""
    return is_int(v) or (type(v) is float and math.isfinite(v))


_SIMPLE: Mapping[Any, Callable[[Any], bool]] = {str: lambda v: type(v) is str, int: is_int, float: is_number, bool: lambda v: type(v) is bool}


@functools.cache
def field_checks(cls: type) -> dict[str, Callable[[Any], bool]]:
    """How each field of a payload dataclass is checked, from its annotation: str, int, float and
    bool (each also with ``| None``), tuples of text and mappings of text to one of them. Enums and
    outcomes are checked by their own parsing; any other annotation is not checked here."""
    hints = typing.get_type_hints(cls)
    return {name: check for name in field_names(cls) if (check := _check_of(hints[name])) is not None}


def _check_of(hint: Any) -> Callable[[Any], bool] | None:
    if hint in _SIMPLE:
        return _SIMPLE[hint]
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:  # X | None
        inner = _check_of(next(a for a in args if a is not type(None)))
        return None if inner is None else lambda v: v is None or inner(v)
    origin = typing.get_origin(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and (item := _check_of(args[0])) is not None:
        return lambda v: isinstance(v, tuple) and all(item(x) for x in v)
    if origin in (Mapping, dict) and len(args) == 2 and args[0] is str and args[1] in _SIMPLE:
        value = _SIMPLE[args[1]]
        return lambda v: isinstance(v, dict) and all(type(k) is str and value(x) for k, x in v.items())
    return None


def _is_outcome(value: object) -> bool:
    try:
        Outcome.parse(value)
    except ValueError:
        return False
    return True


# The latest time a clock may say: the end of year 9999 UTC, the last a datetime holds (reports,
# exports and Optuna turn event times into datetimes).
LAST_TIME = 253402300799.0


def event_time(value: Any) -> float:
    """A time an event can carry: seconds since the epoch a clock gives (ValueError for NaN, an
    infinity, a time before 1970 or past ``LAST_TIME``)."""
    t = float(value)
    if not 0.0 <= t <= LAST_TIME:
        raise ValueError(f"its time {value!r} is no clock's (seconds since 1970, up to {LAST_TIME:.0f})")
    return t


@dataclass(frozen=True)
class Event:
    kind: EventKind
    t: float  # seconds since the epoch, by the writer's clock
    writer: str  # one writer per journal file
    seq: int  # order within the writer
    attempt: int  # the attempt it is about; 0 for events about the trial
    data: Payload

    def __post_init__(self) -> None:
        if not isinstance(self.data, PAYLOADS[self.kind]):
            raise ValueError(f"a {self.kind.value} event carries {PAYLOADS[self.kind].__name__}, not {type(self.data).__name__}")

    @property
    def order(self) -> tuple[float, str, int]:
        return (self.t, self.writer, self.seq)

    def to_json(self) -> dict:
        payload = encode_payload(self.data, drop_empty=True)
        return {"kind": self.kind.value, "t": self.t, "writer": self.writer, "seq": self.seq, "attempt": self.attempt, **payload}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "journal") -> Event:
        try:
            kind = EventKind(obj["kind"])
            if obj.get("how") == AttemptEnd.REJECTED.value and _is_outcome(obj.get("cause")):
                # Journals written before the typed ledger said the outcome in ``cause``.
                obj = {**{k: v for k, v in obj.items() if k != "cause"}, "outcome": obj["cause"]}
            payload = decode_payload(PAYLOADS[kind], obj, _ENUM_FIELDS, _TUPLE_FIELDS)
            seq, attempt = obj["seq"], obj.get("attempt", 0) or 0
            if not (is_int(seq) and is_int(attempt)):
                raise TypeError(f"its seq {seq!r:.40} and attempt {attempt!r:.40} must be whole numbers")
            return cls(kind, event_time(obj["t"]), str(obj["writer"]), seq, attempt, payload)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise CorruptRecord(
                f"{where}: an event does not parse ({type(exc).__name__}: {exc}): {obj!r:.200}; move the damaged journal-*.jsonl aside and rerun"
            ) from None
