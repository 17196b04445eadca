"""The search directory on the shared filesystem: where every record of one search lives.

    <search.root>/<search.revision>/
      contract.json                 frozen once (contract.py)
      identity.json                 the search id its jobs carry on the scheduler (identity.py)
      cancelled.json                who cancelled the whole search, and why (created once: cancel.py)
      held.json                     why dispatching stopped for good: its first trials failed alike (created once)
      trials/<trial_id>/spec.json   the proposed trial, created exclusively
      trials/<trial_id>/dispatch-<n>.json   the n-th dispatch, claimed exclusively by one launcher
      trials/<trial_id>/dispatch-<n>.taken  the slot that took a queued dispatch (created once: launch.slot)
      queue/<trial_id>.<n>          dispatch n waits for a slot (hydra.launcher.dispatch=slots); removed once taken
      slots/<name>.json             a slot job a launcher submitted: its job id, launch and time limit
      trials/<trial_id>/journal-*.jsonl     per-writer event journals (journal.py)
      configs/<config hash>         which trial owns an effective configuration (dedup)
      proposals/<k>.json            proposal k of a sampler that learns, with what it was told (propose.proposals)
      launches/<launch_id>.json     what each launch proposed, admitted, dispatched, deduplicated
      launches/<launch_id>.heartbeat  a launch's latest "alive" (every HEARTBEAT_S), then how it left
      launches/<launch_id>.stopped    the launch stopped dispatching: its slots take nothing more
      checkpoints/, milestones/, prune_decisions/, budget/, quarantine/, submitit/

Owns paths and the create-exclusive claims that make two launchers agree; no decisions.

A shared root holds other users' files, so what is read stays inside the search: every record,
and every folder listed, is read ``within`` the search directory (``fsio.Folder``: a symbolic link
anywhere below it is refused, never followed; a record folder that is one is named at the door,
``contract``), and a trial id becomes a path only once ``check_trial_id`` passed it, whichever file
it came from (a ``spec.json`` naming ``../..`` is damaged, not a trial).
In a process that holds its search (a job: ``anchor.hold``), a SearchDir's path is the held
directory (``/proc/self/fd/N``), so a rename of the search after the process checked it cannot
redirect a read or a write.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from parcel_hpc import anchor, fsio
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.admission import check_trial_id
from parcel_hpc.governance.contract import Contract, load_contract
from parcel_hpc.identity import IDENTITY_FILE, SearchIdentity
from parcel_hpc.ledger.events import Event, Executor
from parcel_hpc.ledger.journal import TrialWriter, events_in, read_events
from parcel_hpc.ledger.records import TrialRecord, TrialSpec, fold

CANCELLED_FILE = "cancelled.json"
HELD_FILE = "held.json"
HEARTBEAT_S = 30.0  # how often a working launch says it is alive
# The folders read commands read records from; a link there would lead out of the search
# (submitit/ and checkpoints/ hold no records read back, and may live elsewhere).
RECORD_FOLDERS = ("trials", "slots", "launches", "budget", "milestones", "off_milestone", "prune_decisions", "proposals", "configs", "quarantine", "selection")


class LauncherState(Enum):
    """What the search's launches say of themselves (``ledger.searches.launcher_state`` decides it)."""

    FOLLOWING = "following"  # a launch works on the search now: dispatching, or following its trials
    ENDED = "ended"  # the last launch followed its trials until every one had ended
    DETACHED = "detached"  # the last launch submitted and left (search.wait=false): the jobs run on the scheduler alone
    STOPPED = "stopped"  # the last launch stopped before its trials ended: interrupted, refused, scheduler gone
    GONE = "gone"  # the last launch stopped writing without a last word (killed, its node lost)
    CANCELLED = "cancelled"  # the search was cancelled (`parcel-hpc cancel`): no launcher dispatches anything of it again
    NONE = "none"  # no launch ever dispatched anything
    UNKNOWN = "unknown"  # its last launch was by a version that wrote no heartbeat

    def is_alive(self) -> bool:
        return self is LauncherState.FOLLOWING


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic collector off for a while: reading a search makes many objects that live on
    and hold no cycles, and its full passes over them find nothing (a fifth of a 100,000-trial
    ``status`` or ``reconcile``: benchmarks/bench_scale.py). Scoped to one read, never a whole
    process: ``--watch`` reads again and again, and what it drops between reads is collected."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass(frozen=True)
class Heartbeat:
    """A launch's latest word: FOLLOWING every ``HEARTBEAT_S`` while it works, then once how it left."""

    at: float  # when it was written, by the launch's clock
    host: str
    pid: int
    state: LauncherState

    def to_json(self) -> dict:
        return {"at": self.at, "host": self.host, "pid": self.pid, "state": self.state.value}

    @classmethod
    def from_json(cls, d: dict) -> Heartbeat:
        return cls(float(d["at"]), str(d["host"]), int(d["pid"]), LauncherState(d["state"]))


@dataclass(frozen=True)
class SearchDir:
    path: Path

    def __post_init__(self) -> None:
        # Inside a process that holds the search (a job, a selection job: ``anchor``), through the held directory.
        object.__setattr__(self, "path", anchor.resolve(Path(self.path).absolute()))

    # --- layout -----------------------------------------------------------------------------
    @property
    def trials_dir(self) -> Path:
        return self.path / "trials"

    def trial_dir(self, trial_id: str) -> Path:
        return self.trials_dir / check_trial_id(trial_id)

    @property
    def submitit_dir(self) -> Path:
        return self.path / "submitit"

    @property
    def quarantine_dir(self) -> Path:
        return self.path / "quarantine"

    @property
    def launches_dir(self) -> Path:
        return self.path / "launches"

    def contract(self) -> Contract:
        """The frozen contract: the door of every command, where the record folders are checked too."""
        for name in RECORD_FOLDERS:
            if (self.path / name).is_symlink():
                raise CorruptRecord(f"{self.path / name} is a symbolic link; a search's records stay inside it: replace the link by the folder itself")
        return load_contract(self.path)

    # --- reading a record: always within the search ------------------------------------------
    def read_json(self, path: Path) -> Any:
        """The record ``path`` of this search (``fsio.read_json`` within it)."""
        return fsio.read_json(path, within=self.path)

    def read_object(self, path: Path, what: str) -> dict[str, Any] | None:
        """The record ``path``, a JSON object; None when it does not exist. CorruptRecord naming it
        when it holds anything else (a list, a number): ``what`` it should have been."""
        try:
            found = self.read_json(path)
        except FileNotFoundError:
            return None
        if not isinstance(found, dict):
            raise CorruptRecord(f"{path} holds a JSON {type(found).__name__}, not {what}; restore it or move it out of the search")
        return found

    def names(self, folder: Path) -> list[str]:
        """The names in the folder ``folder`` of this search ([] while it does not exist), listed within the search."""
        return fsio.names(folder, within=self.path)

    def _read_text(self, path: Path) -> str:
        data = fsio.read_bytes(path, within=self.path)
        try:
            return data.decode().strip()
        except UnicodeDecodeError:
            raise CorruptRecord(f"{path} is not UTF-8 text; restore it or move it out of the search") from None

    def identity(self) -> SearchIdentity | None:
        """The search's id on the scheduler; None for a search frozen before ids existed."""
        found = self.read_object(self.path / IDENTITY_FILE, "a search identity")
        return SearchIdentity.from_json(found) if found is not None else None

    def key(self) -> str:
        """What names this search in another tool (an MLflow tag, an Optuna study): its id, else its
        contract's digest (a search frozen before ids)."""
        identity = self.identity()
        return identity.search_id if identity is not None else self.contract().digest

    def ensure_identity(self, contract_digest: str) -> SearchIdentity:
        """Write the search id once (two launchers racing on a new search agree on the first)."""
        path = self.path / IDENTITY_FILE
        fsio.create_exclusive_json(path, SearchIdentity.new(contract_digest).to_json())
        found = SearchIdentity.from_json(self.read_json(path))
        if found.contract_digest != contract_digest:
            raise CorruptRecord(
                f"{self.path / IDENTITY_FILE} was written for contract {found.contract_digest}, not {contract_digest}; "
                "it was copied from another search: move it aside (a new one is drawn) or restore this search's own"
            )
        return found

    def cancellation(self) -> dict | None:
        """Who cancelled the whole search and why; None while it is not cancelled."""
        return self.read_object(self.path / CANCELLED_FILE, "a cancellation record (the search stays cancelled: a new search.revision starts afresh)")

    def mark_cancelled(self, by: str, reason: str, at: float) -> bool:
        """Cancel the whole search for good; False when it already was (the first cancel stands)."""
        return fsio.create_exclusive_json(self.path / CANCELLED_FILE, {"by": by, "reason": reason, "at": at})

    def hold(self) -> dict | None:
        """The hold that stopped this search's dispatching (``lifecycle.systematic``); None while none did."""
        path = self.path / HELD_FILE
        found = self.read_object(path, "a hold record")
        if found is not None and "outcome" not in found:
            raise CorruptRecord(f"{path} is not a hold record; restore it (the search stays held: a new search.revision starts afresh)")
        return found

    def mark_held(self, record: dict[str, Any]) -> bool:
        """Hold the search for good; False when it already was (the first hold stands). Workers read
        it before each attempt, so a packed job's trials not yet run do not run either."""
        return fsio.create_exclusive_json(self.path / HELD_FILE, record)

    # --- proposals and claims ---------------------------------------------------------------
    def proposal_path(self, k: int) -> Path:
        return self.path / "proposals" / f"{k:06d}.json"

    def write_proposal(self, k: int, record: dict[str, Any]) -> bool:
        """Record proposal ``k`` once; False if another launcher recorded it first."""
        fsio.ensure_dir(self.path / "proposals")
        return fsio.create_exclusive_json(self.proposal_path(k), record)

    def _lease_path(self, k: int) -> Path:
        return self.path / "proposals" / f"{k:06d}.asking"

    def lease_proposal(self, k: int, holder: dict[str, Any]) -> bool:
        """Draw proposal ``k`` alone: ``proposals/<k>.asking``, created exclusively. Proposals are
        drawn one at a time (each is told the one before), so an asker that loses this waits for
        ``k``'s record instead of drawing it too. False while another asker holds it."""
        fsio.ensure_dir(self.path / "proposals")
        return fsio.create_exclusive_json(self._lease_path(k), holder)

    def proposal_lease(self, k: int) -> tuple[int, int] | None:
        """Proposal ``k``'s lease as (inode, mtime in ns): what tells a lease taken again from one
        left in place; None when no one holds it."""
        try:
            st = os.stat(self._lease_path(k))
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def drop_proposal_lease(self, k: int) -> None:
        """The lease this asker took on proposal ``k``, removed once its record is written (never
        another asker's: a lease is drawn over when overdue, not removed)."""
        try:
            os.unlink(self._lease_path(k))
        except FileNotFoundError:
            pass

    def proposal_numbers(self) -> list[int]:
        names = (n.removesuffix(".json") for n in self.names(self.path / "proposals") if n.endswith(".json"))
        return sorted(int(n) for n in names if n.isdigit())

    def write_spec(self, spec: TrialSpec) -> bool:
        """Record a proposed trial; False if it was already proposed (by this or another launch)."""
        d = fsio.ensure_dir(self.trial_dir(spec.trial_id))
        return fsio.create_exclusive_json(d / "spec.json", spec.to_json())

    def claim_config(self, config_hash: str, trial_id: str) -> str:
        """The trial that owns ``config_hash``: ours if we got there first, else the twin's."""
        d = fsio.ensure_dir(self.path / "configs")
        path = d / config_hash.replace(":", "-")
        if fsio.create_exclusive(path, trial_id.encode()):
            return trial_id
        return self._read_text(path)

    def claimed_configs(self) -> set[str]:
        """Every configuration hash a trial has claimed (one listing of ``configs/``)."""
        return {name.replace("-", ":", 1) for name in self.names(self.path / "configs") if not name.startswith(".")}

    def config_owner(self, config_hash: str) -> str | None:
        try:
            return self._read_text(self.path / "configs" / config_hash.replace(":", "-"))
        except FileNotFoundError:
            return None

    def claim_dispatch(self, trial_id: str, launch_id: str, seen: int) -> int | None:
        """Claim dispatch ``seen + 1`` of a trial, ``seen`` being the dispatch count the caller decided
        on; None if another launcher claimed it first (then that launcher dispatches, not this one:
        claiming whatever number comes next would let two launchers that decided at once both go)."""
        n = seen + 1
        if fsio.create_exclusive_json(self.trial_dir(trial_id) / f"dispatch-{n}.json", {"launch_id": launch_id, "dispatch": n}):
            return n
        return None

    def withdraw_dispatch(self, trial_id: str, n: int, launch_id: str) -> None:
        """Mark a dispatch claim whose submission failed (nothing reached the scheduler) as withdrawn,
        so the next launcher dispatches the trial at once instead of waiting for this one. The claim
        itself stays: dispatches are numbered by count, and a hole would break the numbering."""
        fsio.create_exclusive_json(self.trial_dir(trial_id) / f"dispatch-{n}.withdrawn", {"launch_id": launch_id})

    # --- the slots' queue (launch.slot takes from it) -----------------------------------------
    @property
    def queue_dir(self) -> Path:
        return self.path / "queue"

    def enqueue(self, trial_id: str, n: int, launch_id: str) -> None:
        """Dispatch ``n`` of a trial (claimed by ``launch_id``) waits for a slot to take it."""
        fsio.ensure_dir(self.queue_dir)
        fsio.create_exclusive_json(self.queue_dir / f"{check_trial_id(trial_id)}.{n}", {"launch_id": launch_id, "at": time.time()})

    def queued(self) -> list[tuple[str, int]]:
        """Every (trial, dispatch) in the queue, in trial order; a name that is no entry is skipped."""
        out = []
        for name in self.names(self.queue_dir):
            trial_id, _, n = name.rpartition(".")
            try:
                out.append((check_trial_id(trial_id), int(n)))
            except (UsageError, ValueError):
                continue  # a temporary file of a write in flight, or something else: not an entry
        return sorted(out)

    def dequeue(self, trial_id: str, n: int) -> None:
        """Remove a queue entry once it was taken, withdrawn or given up (another may have removed it first)."""
        try:
            os.unlink(self.queue_dir / f"{check_trial_id(trial_id)}.{n}")
        except FileNotFoundError:
            pass

    def take_dispatch(self, trial_id: str, n: int, job_id: str, slot: str) -> bool:
        """A slot takes queued dispatch ``n``; False where another slot took it first."""
        return fsio.create_exclusive_json(self.trial_dir(trial_id) / f"dispatch-{n}.taken", {"job_id": job_id, "slot": slot, "at": time.time()})

    def taken_at(self, trial_id: str, n: int) -> float | None:
        """When a slot (or a launcher giving it up) took dispatch ``n``; None while nobody has."""
        found = self.read_object(self.trial_dir(trial_id) / f"dispatch-{n}.taken", "a taken dispatch")
        return float(found.get("at", 0.0)) if found is not None else None

    def mark_launch_stopped(self, launch_id: str, outcome: str) -> None:
        """A launch stopped dispatching (a drift rejection, a hold): its slots take nothing more."""
        fsio.ensure_dir(self.launches_dir)
        fsio.create_exclusive_json(self.launches_dir / f"{launch_id}.stopped", {"outcome": outcome, "at": time.time()})

    def launch_stopped(self, launch_id: str) -> bool:
        return (self.launches_dir / f"{launch_id}.stopped").exists()

    def dispatch_mark(self, trial_id: str, n: int, mark: str) -> bool:
        """Whether dispatch ``n`` carries ``mark`` ("taken", "withdrawn")."""
        return (self.trial_dir(trial_id) / f"dispatch-{n}.{mark}").exists()

    def write_slot(self, name: str, record: dict[str, Any]) -> None:
        fsio.ensure_dir(self.path / "slots")
        fsio.create_exclusive_json(self.path / "slots" / f"{check_trial_id(name)}.json", record)

    def slot_records(self) -> list[dict]:
        folder = self.path / "slots"
        found = (self.read_object(folder / n, "a slot record") for n in sorted(self.names(folder)) if n.endswith(".json"))
        return [slot for slot in found if slot is not None]

    def dispatch_count(self, trial_id: str) -> int:
        return sum(1 for n in self.names(self.trial_dir(trial_id)) if n.startswith("dispatch-") and n.endswith(".json"))

    def dispatch_in_flight(self, trial_id: str, launch_id: str, record: TrialRecord, grace_s: float = 300.0) -> bool:
        """Another launcher claimed this trial's latest dispatch recently and has not submitted it yet."""
        n = self.dispatch_count(trial_id)
        if n == 0 or len(record.jobs) >= n:
            return False
        path = self.trial_dir(trial_id) / f"dispatch-{n}.json"
        if path.with_suffix(".withdrawn").exists():
            return False
        claim = self.read_object(path, "a dispatch claim")
        return claim is not None and claim.get("launch_id") != launch_id and time.time() - path.stat().st_mtime < grace_s

    # --- reading ----------------------------------------------------------------------------
    def spec(self, trial_id: str) -> TrialSpec:
        with fsio.Folder.open(self.trial_dir(trial_id), within=self.path) as folder:
            return read_spec(folder, trial_id)

    def trial_ids(self) -> list[str]:
        """Every trial with a spec. An unreadable trials/ is an error (PermissionError), never 0 trials."""
        try:
            trials = fsio.Folder.open(self.trials_dir, within=self.path)
        except FileNotFoundError:
            return []
        with trials:
            return _trial_ids_in(trials)

    def events(self, trial_id: str) -> list[Event]:
        return read_events(self.trial_dir(trial_id), within=self.path)

    def record(self, trial_id: str) -> TrialRecord:
        return self.fold(self.spec(trial_id), self.events(trial_id))

    def fold(self, spec: TrialSpec, events: list[Event]) -> TrialRecord:
        """``fold``, with a damaged history reported as one line naming the trial."""
        trial_id = spec.trial_id
        try:
            return fold(spec, events)
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptRecord(
                f"the records of trial {trial_id} in {self.trial_dir(trial_id)} do not fold ({type(exc).__name__}: {exc}); "
                "move the damaged journal-*.jsonl or spec.json aside and rerun"
            ) from None

    def claim_attempt(self, trial_id: str, first: int) -> int:
        """The next attempt number, claimed exclusively (two workers never share one, even when a
        cached directory listing on NFS hides a newer journal)."""
        n = first
        while not fsio.create_exclusive_json(self.trial_dir(trial_id) / f"attempt-{n}.json", {"attempt": n}):
            n += 1
        return n

    def records(self) -> list[TrialRecord]:
        """Every trial's record, in trial order (folded with the collector paused)."""
        with collector_paused():
            return [record for record, _ in self.histories()]

    def histories(self) -> Iterator[tuple[TrialRecord, list[Event]]]:
        """Every trial's record with the events it was folded from (each journal read once), in
        trial order. Each trial's folder is opened once for its spec and its journals; a trial
        removed since ``trial_ids`` listed it is no longer the search's, and is passed over."""
        try:
            trials = fsio.Folder.open(self.trials_dir, within=self.path)
        except FileNotFoundError:
            return
        with trials:
            for tid in _trial_ids_in(trials):
                try:
                    with trials.folder(tid) as folder:
                        spec, events = read_spec(folder, tid), events_in(folder)
                except FileNotFoundError:
                    continue
                yield self.fold(spec, events), events

    def writer(self, trial_id: str, role: str) -> TrialWriter:
        """The one way to add to a trial's history (a new journal file for this process and role)."""
        return TrialWriter(self.trial_dir(trial_id), role)

    def write_plan(self, trial_id: str, plan: dict[str, Any]) -> bool:
        """Record the worker plan once; False if the trial already has one (it is kept)."""
        return fsio.create_exclusive_json(self.trial_dir(trial_id) / "plan.json", plan)

    def plan_json(self, trial_id: str) -> dict[str, Any]:
        return self.read_json(self.trial_dir(trial_id) / "plan.json")

    def launches(self) -> list[dict]:
        """Every launch record, oldest first; CorruptRecord for one that is not a JSON object."""
        names = sorted(n for n in self.names(self.launches_dir) if n.endswith(".json") and not n.startswith("."))
        found = (self.read_object(self.launches_dir / name, "a launch record") for name in names)
        return [launch for launch in found if launch is not None]  # None: gone since it was listed

    def last_launcher(self) -> dict | None:
        """The launcher settings of the latest launch that dispatched anything (resubmit, cancel and
        the selection jobs reuse them); None when nothing was ever dispatched."""
        return next((l["launcher"] for l in reversed(self.launches()) if l.get("launcher")), None)

    def job_names(self, kind: Executor) -> list[str]:
        """The scheduler names of this search's trial jobs on the ``kind`` of launcher (squeue and sacct find them by these).
        Each carries the search id; a launch recorded before ids existed used the bare job name."""
        return sorted(
            {
                str(l["launcher"].get("scheduler_job_name") or l["launcher"]["params"]["job_name"])
                for l in self.launches()
                if l.get("launcher", {}).get("kind") == kind
            }
        )

    # --- quarantine marks ----------------------------------------------------------------------
    def mark_quarantined(self, trial_id: str, attempts_upto: int, reason: str) -> bool:
        d = fsio.ensure_dir(self.quarantine_dir / "marks")
        return fsio.create_exclusive_json(d / f"{trial_id}-a{attempts_upto}.json", {"trial_id": trial_id, "attempts_upto": attempts_upto, "reason": reason})

    def is_quarantined_attempt(self, trial_id: str, attempt: int) -> bool:
        """Has an attempt numbered ``attempt`` (or later) of this trial been quarantined?"""
        names = [n for n in self.names(self.quarantine_dir / "marks") if n.startswith(f"{trial_id}-a") and n.endswith(".json")]
        return any(int(n.removesuffix(".json").rsplit("-a", 1)[1]) >= attempt for n in names)

    def write_launch(self, launch_id: str, summary: dict) -> None:
        fsio.ensure_dir(self.launches_dir)
        fsio.atomic_write_json(self.launches_dir / f"{launch_id}.json", summary)

    def write_heartbeat(self, launch_id: str, beat: Heartbeat) -> None:
        """A working launch says it is alive (and, last, how it left)."""
        fsio.ensure_dir(self.launches_dir)
        fsio.atomic_write_json(self._heartbeat_path(launch_id), beat.to_json())

    def withdraw_heartbeat(self, launch_id: str) -> None:
        """A launch that did nothing leaves no word: the launches before it say how the search stands."""
        self._heartbeat_path(launch_id).unlink(missing_ok=True)

    def _heartbeat_path(self, launch_id: str) -> Path:
        return self.launches_dir / f"{launch_id}.heartbeat"

    def heartbeats(self) -> dict[str, Heartbeat]:
        """Each launch's latest word, by launch id."""
        out = {}
        for name in (n for n in self.names(self.launches_dir) if n.endswith(".heartbeat")):
            try:
                out[name.removesuffix(".heartbeat")] = Heartbeat.from_json(self.read_json(self.launches_dir / name))
            except (CorruptRecord, KeyError, TypeError, ValueError, OSError):
                continue  # a damaged (or vanished, or unreadable) heartbeat says nothing: its launch reads as gone once it is old
        return out


def read_spec(folder: fsio.Folder, trial_id: str) -> TrialSpec:
    """The spec of trial ``trial_id`` in its open folder; CorruptRecord naming it when damaged."""
    try:
        spec = TrialSpec.from_json(folder.read_json("spec.json"))
    except (KeyError, ValueError, TypeError, AttributeError, UsageError) as exc:
        raise CorruptRecord(f"{folder.name_of('spec.json')} is not a trial spec ({exc}); restore it or move the trial aside") from None
    if spec.trial_id != trial_id:
        raise CorruptRecord(
            f"{folder.name_of('spec.json')} names trial {spec.trial_id!r}, not {trial_id!r}: it was copied from elsewhere; restore it or move the trial aside"
        )
    return spec


def _trial_ids_in(trials: fsio.Folder) -> list[str]:
    """The trials with a spec in the open ``trials/`` folder; CorruptRecord for anything in it that
    is no trial's folder (a link, a name that is no trial id)."""
    found = [e for e in trials.entries() if not e.name.startswith(".")]
    for e in found:
        if e.is_symlink():
            raise CorruptRecord(f"{trials.name_of(e.name)} is a symbolic link; a trial's records stay inside the search: remove the link")
        try:
            check_trial_id(e.name)
        except UsageError:
            raise CorruptRecord(f"{trials.where} holds {e.name!r}, which is not a trial id; move it out of trials/") from None
    return sorted(e.name for e in found if e.is_dir(follow_symlinks=False) and _holds(trials, f"{e.name}/spec.json"))


def _holds(folder: fsio.Folder, relative: str) -> bool:
    """Whether ``relative`` (a path below ``folder`` whose folders were checked) exists, as anything."""
    try:
        os.stat(relative, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
