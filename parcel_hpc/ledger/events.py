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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from parcel_hpc.errors import CorruptRecord
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


class Executor(str, enum.Enum):
    """Where a trial's jobs run: submitit's local executor or SLURM."""

    LOCAL = "local"
    SLURM = "slurm"


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
    # Training failures: retried once; the same class twice is a reproducible result about the design.
    EXCEPTION = "exception"
    DIVERGED = "diverged"
    OUT_OF_MEMORY = "out_of_memory"
    UNSAVABLE_STATE = "unsavable_state"  # the trainer's state is not arrays and JSON scalars
    INVALID_PREDICTIONS = "invalid_predictions"  # the trainer's predictions are not one probability per example
    DEVICES_NOT_GRANTED = "devices_not_granted"  # the trainer asked for more GPUs than the attempt was granted
    # Governance.
    DRIFT = "drift"  # the worker's environment differs from the contract: nothing ran, the trial stays queued
    CHECKPOINT_COLLISION = "checkpoint_collision"  # quarantine: two trials on one checkpoint prefix
    RETRIES_EXHAUSTED = "retries_exhausted"
    CANCELLED_BY_OWNER = "cancelled_by_owner"  # `parcel-hpc cancel`: never retried or resubmitted

    def is_training_failure(self) -> bool:
        return self in (Cause.EXCEPTION, Cause.DIVERGED, Cause.OUT_OF_MEMORY, Cause.UNSAVABLE_STATE, Cause.INVALID_PREDICTIONS, Cause.DEVICES_NOT_GRANTED)

    def is_infrastructure(self) -> bool:
        return self in _INFRASTRUCTURE

    def counts_as_interruption(self) -> bool:
        """Spends a retry: an infrastructure ending that was not a newer attempt taking over."""
        return self.is_infrastructure() and self is not Cause.SUPERSEDED


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

    executor: Executor = Executor.LOCAL
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


@dataclass(frozen=True)
class Milestone:
    step: int
    value: float
    is_milestone: bool = True  # False: the final step off the milestone grid (never a peer)
    train: Mapping[str, float] | None = None  # the trainer's metrics of this step (loss, ...)


@dataclass(frozen=True)
class DeviceUse:
    """What an attempt used of the devices it was granted, read by its worker (``worker/devices.py``)."""

    devices: tuple[str, ...] = ()  # one name per granted GPU ("NVIDIA H200"); ("cpu",) when it was granted none
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated, the largest of its devices (None: not read)
    utilization: float | None = None  # mean GPU utilization in 0..1 over NVML's samples (None: NVML did not answer)
    samples: int = 0  # NVML readings behind ``utilization``
    frameworks: Mapping[str, str] | None = None  # the versions the trainer ran with: {"torch": "2.13.0+cpu", "cuda": "12.8"}

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError('a device use names its devices: ("cpu",) when the attempt was granted no GPU')
        if self.utilization is not None and not 0.0 <= self.utilization <= 1.0:
            raise ValueError(f"utilization is a fraction in 0..1, not {self.utilization!r}")
        if (self.utilization is None) != (self.samples == 0):
            raise ValueError(f"a utilization is the mean of its samples: {self.utilization!r} from {self.samples} samples")
        if self.peak_memory_bytes is not None and self.peak_memory_bytes < 0:
            raise ValueError(f"peak memory is bytes, not {self.peak_memory_bytes!r}")


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
    metric: float | None = None  # completed: the final validation value
    value: float | None = None  # pruned: the value at the milestone
    milestone: int | None = None  # pruned: where
    final: bool = False  # failed: the same class failed before, so this failure is the result
    outcome: Outcome | None = None  # rejected: reject:<field>; budget_exhausted: hold:budget
    reason: str = ""  # for people: the prune rule, the quarantine, the budget overshoot
    message: str = ""  # the error text of a failure, or who resolved it
    job_id: str = ""
    error_type: str = ""  # failed: the exception's class name
    traceback: str = ""  # failed: the worker's traceback (``parcel-hpc logs`` prints it)

    def __post_init__(self) -> None:
        how, cause = self.how, self.cause
        if how is AttemptEnd.COMPLETED and (self.metric is None or not math.isfinite(self.metric)):
            raise ValueError(f"a completed attempt carries a finite metric, not {self.metric!r}")
        if how is not AttemptEnd.COMPLETED and self.metric is not None:
            raise ValueError(f"only a completed attempt carries a metric ({how.value} has {self.metric!r})")
        if how is AttemptEnd.FAILED and (cause is None or not cause.is_training_failure()):
            raise ValueError(f"a failed attempt names its failure class, not {cause!r}")
        if how.is_infrastructure() and (cause is None or not cause.is_infrastructure()):
            raise ValueError(f"an {how.value} attempt names an infrastructure cause, not {cause!r}")
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


def normalized_message(message: str) -> str:
    """An error message with what varies between trials of one bug blanked out (quoted values,
    paths, hex ids, numbers): two trials failing alike give the same text (pure)."""
    text = " ".join(message.split())
    for pattern, mark in zip(_VOLATILE, ("'…'", "<path>", "<hex>", "<n>")):
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


Payload = Submitted | AdmissionRefused | Started | Admitted | Resumed | Milestone | CheckpointSkipped | DeviceUse | Ended | Quarantined | GaveUp | Cancelled

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
}
_ENUM_FIELDS: Mapping[str, Callable[[Any], Any]] = {
    "how": AttemptEnd,
    "cause": Cause,
    "state": TrialState,
    "executor": Executor,
    "outcome": Outcome.parse,
    "fence": FenceLayer,
}
_TUPLE_FIELDS = ("exclude_nodes", "with_trials", "devices")


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
    """The inverse of ``encode_payload``: absent fields take their defaults."""
    values = {}
    for name in field_names(payload_cls):
        if name not in obj:
            continue
        v = obj[name]
        if name in enums:
            v = enums[name](v)
        elif name in tuples:
            v = tuple(v)
        values[name] = v
    return payload_cls(**values)


def _is_outcome(value: object) -> bool:
    try:
        Outcome.parse(value)
    except ValueError:
        return False
    return True


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
            return cls(kind, float(obj["t"]), str(obj["writer"]), int(obj["seq"]), int(obj.get("attempt", 0) or 0), payload)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise CorruptRecord(
                f"{where}: an event does not parse ({type(exc).__name__}: {exc}): {obj!r:.200}; move the damaged journal-*.jsonl aside and rerun"
            ) from None
