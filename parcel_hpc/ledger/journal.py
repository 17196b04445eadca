"""The one way a trial's history is written: per-writer, append-only journals of typed events.

Each process that records something about a trial (the launch that submitted it, each worker
attempt, ``resubmit``, ``sync``, a quarantine) appends through its own ``TrialWriter`` to its own
``journal-<writer>.jsonl``: one writer per file keeps appends safe on NFS, where O_APPEND from two
clients is not atomic. Readers merge every journal of the trial and order events by
(time, writer, sequence); a torn last line (a writer killed mid-append) is ignored.

Must not: decide anything. Callers decide (lifecycle, resolution, the worker) and say it here.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger.events import (
    Accounted,
    AdmissionRefused,
    Admitted,
    Cancelled,
    Cause,
    CheckpointSkipped,
    DeviceUse,
    Ended,
    Event,
    EventKind,
    Executor,
    GaveUp,
    Milestone,
    Payload,
    Quarantined,
    Resumed,
    Started,
    Submitted,
)
from parcel_hpc.ledger.states import TrialState

JOURNAL_GLOB = "journal-*.jsonl"
_PREFIX, _SUFFIX = JOURNAL_GLOB.split("*")


def writer_name(role: str) -> str:
    host = socket.gethostname().split(".")[0]
    return f"{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class TrialWriter:
    """Appends typed events about one trial from one writer; one method per event kind."""

    def __init__(self, trial_dir: Path, role: str, clock: Callable[[], float] = time.time, *, writer: str | None = None) -> None:
        self.trial_dir = Path(trial_dir)
        self.writer = writer or writer_name(role)
        self._clock = clock
        self._seq = 0
        self._dir_ready = False

    @property
    def path(self) -> Path:
        return self.trial_dir / f"journal-{self.writer}.jsonl"

    def _append(self, kind: EventKind, payload: Payload, attempt: int = 0) -> Event:
        self._seq += 1
        event = Event(kind, round(self._clock(), 6), self.writer, self._seq, attempt, payload)
        if not self._dir_ready:  # once per writer, on its first event: a writer that says nothing creates nothing
            fsio.ensure_dir(self.trial_dir)
            self._dir_ready = True
        fsio.append_jsonl(self.path, event.to_json())
        return event

    # --- the launch side ------------------------------------------------------------------------
    def submitted(self, job_id: str, executor: Executor, launch_id: str, exclude_nodes: Sequence[str] = ()) -> Event:
        return self._append(EventKind.SUBMITTED, Submitted(job_id, executor, launch_id, tuple(exclude_nodes)))

    def admission_refused(self, outcome: Outcome, launch_id: str) -> Event:
        return self._append(EventKind.ADMISSION, AdmissionRefused(outcome, launch_id))

    def gave_up(self, reason: str, attempt: int = 0) -> Event:
        return self._append(EventKind.GAVE_UP, GaveUp(Cause.RETRIES_EXHAUSTED, reason, TrialState.FAILED), attempt)

    def cancelled(self, by: str, reason: str, whole_search: bool) -> Event:
        return self._append(EventKind.CANCELLED, Cancelled(by, reason, whole_search))

    def accounted(self, run: Accounted, attempt: int = 0) -> Event:
        """The scheduler filed ``run`` (``attempt``: this trial's attempt that ran in it, 0 for none)."""
        return self._append(EventKind.ACCOUNTED, run, attempt)

    def resolved(self, attempt: int, ending: Ended) -> Event:
        """How a silent attempt ended, from the scheduler's facts (``resolution.resolve``)."""
        return self._append(EventKind.RESOLVED, ending, attempt)

    def quarantined(self, reason: str, attempts_upto: int, moved_to: str, with_trials: Sequence[str]) -> Event:
        return self._append(EventKind.QUARANTINED, Quarantined(reason, attempts_upto, moved_to, tuple(with_trials)))

    # --- the worker side ------------------------------------------------------------------------
    def started(self, attempt: int, facts: Started) -> Event:
        return self._append(EventKind.STARTED, facts, attempt)

    def admitted(self, attempt: int, observed: Admitted) -> Event:
        return self._append(EventKind.ADMITTED, observed, attempt)

    def resumed(self, attempt: int, step: int, exact: bool = True, fold: int | None = None) -> Event:
        return self._append(EventKind.RESUMED, Resumed(step, exact, fold), attempt)

    def milestone(self, attempt: int, step: int, value: float, is_milestone: bool, train: Mapping[str, float] | None = None, fold: int | None = None) -> Event:
        return self._append(EventKind.MILESTONE, Milestone(step, value, is_milestone, dict(train) if train else None, fold), attempt)

    def checkpoint_skipped(self, attempt: int, path: str, reason: str) -> Event:
        return self._append(EventKind.CHECKPOINT_SKIPPED, CheckpointSkipped(path, reason), attempt)

    def device_use(self, attempt: int, use: DeviceUse) -> Event:
        return self._append(EventKind.DEVICE_USE, use, attempt)

    def ended(self, attempt: int, ending: Ended) -> Event:
        return self._append(EventKind.ENDED, ending, attempt)


def journals(folder: fsio.Folder) -> list[os.DirEntry[str]]:
    """The journal files of the trial folder ``folder`` (open: a search's read commands list every
    trial's), by name. An entry's ``stat`` is its own, never a link's target."""
    return sorted((e for e in folder.entries() if e.name.startswith(_PREFIX) and e.name.endswith(_SUFFIX)), key=lambda e: e.name)


def read_events(trial_dir: Path, within: Path | None = None) -> list[Event]:
    """Every event of the trial folder ``trial_dir`` (none while it does not exist), in order.
    ``within``: the search directory it is in, below which no link is followed (``fsio.Folder``)."""
    try:
        with fsio.Folder.open(trial_dir, within=within) as folder:
            return events_in(folder)
    except FileNotFoundError:
        return []


def events_in(folder: fsio.Folder) -> list[Event]:
    """Every event of the open trial folder ``folder``, in order."""
    events: list[Event] = []
    for entry in journals(folder):
        where = folder.name_of(entry.name)
        events.extend(Event.from_json(obj, where) for obj in folder.read_jsonl(entry.name))
    events.sort(key=lambda e: e.order)
    return events


def preview(attempt: int, ending: Ended, t: float) -> Event:
    """The event ``TrialWriter.resolved`` would write, for folding before (or without) writing it."""
    return Event(EventKind.RESOLVED, t, "preview", 0, attempt, ending)
