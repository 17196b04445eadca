"""The selection's history: typed events about choosing, checking and releasing a search's winner.

Owns ``SelectionEventKind``, ``JobRole``, one frozen payload per
kind, ``SelectionWriter`` (the only writer of ``<search>/selection/journal-*.jsonl``, one file per
writer, like trial journals) and ``fold_selection``, the one function from those events to a
``SelectionRecord``. Must not decide anything: ``parcel_hpc.selection`` decides and says it here.

A line is flat: ``{"kind", "t", "writer", "seq", **payload}``.
"""

from __future__ import annotations

import enum
import fnmatch
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger.events import Executor, decode_payload, encode_payload
from parcel_hpc.ledger.journal import JOURNAL_GLOB, writer_name

# What a selection may do next: the project card's four, and the two other holds a selection's
# validation evidence can decide before the final partition is read (``selection.gates``).
DISPOSITIONS = (
    Outcome.HOLD_BUDGET,
    Outcome.HOLD_INVALID_WINNER,
    Outcome.HOLD_SERVING_PARITY,
    Outcome.HOLD_PERFORMANCE,
    Outcome.HOLD_SLICE_QUALITY,
    Outcome.EVALUATE_FINAL,
)


class JobRole(str, enum.Enum):
    RERUN = "rerun"  # rerun the winner, retrain the baseline, score both per slice, check serving parity
    FINAL = "final"  # the one evaluation on the protected final partition


class SelectionEventKind(str, enum.Enum):
    FROZEN = "frozen"  # a selection froze the completed list and named its trial
    JOB_SUBMITTED = "job_submitted"
    JOB_ENDED = "job_ended"
    DISPOSED = "disposed"  # the disposition computed from the selection's facts
    DECIDED = "decided"  # a documented quality decision about the selected trial
    FINAL_ATTEMPT = "final_attempt"  # someone asked for the final evaluation, allowed or refused
    FINAL_OPENED = "final_opened"  # a final job is about to read the protected partition (each run, requeues too)
    FINAL_SEALED = "final_sealed"  # the final result is written, once
    RELEASED = "released"  # a release packet was published (registered or held)


@dataclass(frozen=True)
class Frozen:
    selection: int
    trial_id: str  # "" when no completed trial was there to select
    metric: float | None
    list_digest: str  # digest of the frozen completed list (selection-<n>.json holds the list)
    completed: int
    candidates: int
    early: bool  # selected before the budget cap (--now)
    reason: str  # why early, or why a new selection replaces the previous one
    by: str


@dataclass(frozen=True)
class JobSubmitted:
    selection: int
    role: JobRole
    job_id: str  # a SLURM job id, or the local process's pid on ``host``
    executor: Executor
    host: str = ""


@dataclass(frozen=True)
class JobEnded:
    selection: int
    role: JobRole
    job_id: str
    ok: bool
    result_digest: str = ""
    message: str = ""


@dataclass(frozen=True)
class Disposed:
    selection: int
    outcome: Outcome  # one of DISPOSITIONS
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.outcome not in DISPOSITIONS:
            raise ValueError(f"a selection's disposition is one of {', '.join(map(str, DISPOSITIONS))}, not {self.outcome}")


@dataclass(frozen=True)
class Decided:
    selection: int
    trial_id: str
    lifted: Outcome
    by: str
    reason: str

    def __post_init__(self) -> None:
        if not self.lifted.is_decidable:
            raise ValueError(f"a decision lifts a hold a team may trade (performance, slice-quality, final-performance), not {self.lifted}")
        if not self.by.strip() or not self.reason.strip():
            raise ValueError("a quality decision names who decided and why")


@dataclass(frozen=True)
class FinalAttempt:
    selection: int
    allowed: bool
    outcome: Outcome  # evaluate:final-holdout, or why it was refused
    by: str
    host: str
    pid: int
    retry: bool = False  # allowed again: the claimed evaluation's job ended without a result


@dataclass(frozen=True)
class FinalOpened:
    selection: int
    job_id: str
    host: str
    pid: int
    restart_count: int = 0  # SLURM_RESTART_COUNT: a requeued job opens it again, and says so


@dataclass(frozen=True)
class FinalSealed:
    selection: int
    trial_id: str
    result_digest: str


@dataclass(frozen=True)
class Released:
    selection: int
    registered: bool
    outcome: Outcome  # release:registered, or the hold that kept it out of the registry
    packet_digest: str
    registry_path: str = ""


SelectionPayload = Frozen | JobSubmitted | JobEnded | Disposed | Decided | FinalAttempt | FinalOpened | FinalSealed | Released

PAYLOADS: Mapping[SelectionEventKind, type] = {
    SelectionEventKind.FROZEN: Frozen,
    SelectionEventKind.JOB_SUBMITTED: JobSubmitted,
    SelectionEventKind.JOB_ENDED: JobEnded,
    SelectionEventKind.DISPOSED: Disposed,
    SelectionEventKind.DECIDED: Decided,
    SelectionEventKind.FINAL_ATTEMPT: FinalAttempt,
    SelectionEventKind.FINAL_OPENED: FinalOpened,
    SelectionEventKind.FINAL_SEALED: FinalSealed,
    SelectionEventKind.RELEASED: Released,
}
# Per payload class: which fields are typed values read from their JSON text.
_ENUMS: Mapping[type, Mapping[str, Callable[[Any], Any]]] = {
    JobSubmitted: {"role": JobRole, "executor": Executor},
    JobEnded: {"role": JobRole},
    Disposed: {"outcome": Outcome.parse},
    Decided: {"lifted": Outcome.parse},
    FinalAttempt: {"outcome": Outcome.parse},
    Released: {"outcome": Outcome.parse},
}
_TUPLES = ("reasons",)


@dataclass(frozen=True)
class SelectionEvent:
    kind: SelectionEventKind
    t: float
    writer: str
    seq: int
    data: SelectionPayload

    def __post_init__(self) -> None:
        if not isinstance(self.data, PAYLOADS[self.kind]):
            raise ValueError(f"a {self.kind.value} event carries {PAYLOADS[self.kind].__name__}, not {type(self.data).__name__}")

    def to_json(self) -> dict:
        payload = encode_payload(self.data, drop_empty=False)  # a selection's None (no trial, no metric) is a fact
        return {"kind": self.kind.value, "t": self.t, "writer": self.writer, "seq": self.seq, **payload}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str) -> SelectionEvent:
        try:
            kind = SelectionEventKind(obj["kind"])
            payload_cls = PAYLOADS[kind]
            payload = decode_payload(payload_cls, obj, _ENUMS.get(payload_cls, {}), _TUPLES)
            return cls(kind, float(obj["t"]), str(obj["writer"]), int(obj["seq"]), payload)
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptRecord(f"{where}: a selection event does not parse ({type(exc).__name__}: {exc}); move the damaged journal aside and rerun") from None


class SelectionWriter:
    """Appends typed selection events from one writer to its own journal file."""

    def __init__(self, selection_dir: Path, role: str, clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(selection_dir)
        self.writer = writer_name(role)
        self._clock = clock
        self._seq = 0
        self._dir_ready = False

    def _append(self, kind: SelectionEventKind, payload: SelectionPayload) -> SelectionEvent:
        self._seq += 1
        event = SelectionEvent(kind, round(self._clock(), 6), self.writer, self._seq, payload)
        if not self._dir_ready:  # once per writer, on its first event, as TrialWriter does
            fsio.ensure_dir(self.dir)
            self._dir_ready = True
        fsio.append_jsonl(self.dir / f"journal-{self.writer}.jsonl", event.to_json())
        return event

    def frozen(self, payload: Frozen) -> SelectionEvent:
        return self._append(SelectionEventKind.FROZEN, payload)

    def job_submitted(self, selection: int, role: JobRole, job_id: str, executor: Executor, host: str = "") -> SelectionEvent:
        return self._append(SelectionEventKind.JOB_SUBMITTED, JobSubmitted(selection, role, job_id, executor, host))

    def job_ended(self, selection: int, role: JobRole, job_id: str, ok: bool, result_digest: str = "", message: str = "") -> SelectionEvent:
        return self._append(SelectionEventKind.JOB_ENDED, JobEnded(selection, role, job_id, ok, result_digest, message[:500]))

    def disposed(self, selection: int, outcome: Outcome, reasons: Sequence[str]) -> SelectionEvent:
        return self._append(SelectionEventKind.DISPOSED, Disposed(selection, outcome, tuple(reasons)))

    def decided(self, payload: Decided) -> SelectionEvent:
        return self._append(SelectionEventKind.DECIDED, payload)

    def final_attempt(self, payload: FinalAttempt) -> SelectionEvent:
        return self._append(SelectionEventKind.FINAL_ATTEMPT, payload)

    def final_opened(self, payload: FinalOpened) -> SelectionEvent:
        return self._append(SelectionEventKind.FINAL_OPENED, payload)

    def final_sealed(self, selection: int, trial_id: str, result_digest: str) -> SelectionEvent:
        return self._append(SelectionEventKind.FINAL_SEALED, FinalSealed(selection, trial_id, result_digest))

    def released(self, payload: Released) -> SelectionEvent:
        return self._append(SelectionEventKind.RELEASED, payload)


def read_selection_events(selection_dir: Path, within: Path | None = None) -> list[SelectionEvent]:
    """Every selection event in ``selection_dir`` (read ``within`` the search directory), in order."""
    events: list[SelectionEvent] = []
    with fsio.Folder.open(selection_dir, within=within) as folder:
        for name in sorted(e.name for e in folder.entries() if fnmatch.fnmatchcase(e.name, JOURNAL_GLOB)):
            events.extend(SelectionEvent.from_json(obj, folder.name_of(name)) for obj in folder.read_jsonl(name))
    events.sort(key=lambda e: (e.t, e.writer, e.seq))
    return events


@dataclass(frozen=True)
class SelectionRecord:
    """Everything said about a search's selections, folded (pure) from the selection journals.

    Which selection is current is the store's to say (``SelectionStore.current``): the frozen
    files and the final evaluation's claim decide it, not the journal."""

    selections: Mapping[int, Frozen] = field(default_factory=dict)
    jobs: Mapping[tuple[int, JobRole], tuple[JobSubmitted | JobEnded, ...]] = field(default_factory=dict)
    decisions: Mapping[int, tuple[Decided, ...]] = field(default_factory=dict)
    final_attempts: tuple[tuple[float, FinalAttempt], ...] = ()  # (time, attempt), every one
    final_opened: tuple[tuple[float, FinalOpened], ...] = ()  # (time, opening), every read of the final partition
    sealed: FinalSealed | None = None
    releases: tuple[Released, ...] = ()  # every release packet published, registered or held

    def registered(self, selection: int) -> Released | None:
        """The release that registered selection ``selection``'s artifact, if one did."""
        return next((r for r in self.releases if r.selection == selection and r.registered), None)

    def job_ended(self, selection: int, role: JobRole) -> JobEnded | None:
        ended = [e for e in self.jobs.get((selection, role), ()) if isinstance(e, JobEnded)]
        return ended[-1] if ended else None

    def last_job(self, selection: int, role: JobRole) -> JobSubmitted | JobEnded | None:
        events = self.jobs.get((selection, role), ())
        return events[-1] if events else None


def fold_selection(events: Sequence[SelectionEvent]) -> SelectionRecord:
    selections: dict[int, Frozen] = {}
    jobs: dict[tuple[int, JobRole], list] = {}
    decisions: dict[int, list[Decided]] = {}
    attempts: list[tuple[float, FinalAttempt]] = []
    opened: list[tuple[float, FinalOpened]] = []
    sealed: FinalSealed | None = None
    releases: list[Released] = []
    for ev in events:
        d = ev.data
        if isinstance(d, Frozen):
            selections.setdefault(d.selection, d)  # the selection file is exclusive; its first event stands
        elif isinstance(d, (JobSubmitted, JobEnded)):
            jobs.setdefault((d.selection, d.role), []).append(d)
        elif isinstance(d, Decided):
            decisions.setdefault(d.selection, []).append(d)
        elif isinstance(d, FinalAttempt):
            attempts.append((ev.t, d))
        elif isinstance(d, FinalOpened):
            opened.append((ev.t, d))
        elif isinstance(d, FinalSealed):
            sealed = sealed or d  # sealed once: the result file is exclusive
        elif isinstance(d, Released):
            releases.append(d)
    return SelectionRecord(
        selections, {k: tuple(v) for k, v in jobs.items()}, {k: tuple(v) for k, v in decisions.items()}, tuple(attempts), tuple(opened), sealed, tuple(releases)
    )
