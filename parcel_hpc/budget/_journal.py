"""The reservation journal: budget enforced across processes and nodes with no lock and no server.

Owns ``<search_dir>/budget/journal/<seq:08d>.json``. Entry 0 (``open``) records the caps, frozen
with the search's contract; every later entry is a ``reserve``, ``settle`` or ``release`` and
carries the running totals after it, plus the digest of the entry before it. A ``restate`` changes
what a settled attempt is charged to what the scheduler's record of its run gives it (an attempt
someone else settled when it noticed the loss, before sacct had filed the run): its hours were
spent, so no cap refuses it. (Older journals may
also hold ``caps`` entries; readers still apply them, nothing writes them now.) A writer reads the
tail, decides against those totals, and creates entry n+1 with ``fsio.create_exclusive``; losing
that race (EEXIST) means someone else appended, so it reads the new entry and decides again. The
sequence therefore has no gaps, and two writers can never both spend the same headroom: a cap is
never overshot by reservations, however many attempts race.

A writer killed mid-write leaves only a dot-prefixed temp file (``create_exclusive`` writes then
links), never a partial entry, so it cannot wedge the journal. Every reader replays the chain once
(incrementally afterwards) and raises ``CorruptRecord`` naming the first entry whose running totals,
digest or sequence do not follow.

Replaying from entry 0 in every process would make a search of N attempts cost O(N^2) reads, so
the writer of every ``FOLD_EVERY``-th entry also writes ``budget/folds/<seq:08d>.json``: the replayed
state after that entry (create-exclusive), which a new reader starts from once it has checked that
it chains to the entry it names; a ledger kept open (a worker's, across the trials of its pack)
reads only what was appended since. ``verify`` replays everything, folds aside.

Hours are stored as integer micro-hours so that running totals add exactly on every host.

Must not: decide trial states (the caller marks trials ``budget_exhausted``), measure usage (the
caller settles with what sacct or the worker measured), or read config.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import ClassVar, Literal, cast

from parcel_hpc import fsio
from parcel_hpc.budget._values import BudgetCaps, CapLine, JournalTotals, check_number, fmt
from parcel_hpc.errors import CorruptRecord, ParcelError, UsageError

JOURNAL_VERSION = 1
UH_PER_HOUR = 1_000_000
_ENTRY_NAME = re.compile(r"^(\d{8})\.json$")
_MAX_TRIES = 10_000  # each lost race means another writer made progress; this only stops a livelock
FOLD_EVERY = 512  # entries between fold checkpoints: a new reader replays at most this many


class KeyState(Enum):
    HELD = "held"
    SETTLED = "settled"
    RELEASED = "released"

    def is_closed(self) -> bool:
        return self is not KeyState.HELD


class EntryKind(Enum):
    OPEN = "open"
    CAPS = "caps"  # read only: an older journal's change of caps; no writer makes one any more
    RESERVE = "reserve"
    SETTLE = "settle"
    RELEASE = "release"
    RESTATE = "restate"  # a settled attempt's hours, as the scheduler's record of its run gives them


class BudgetOutcome(str, Enum):
    EXHAUSTED = "budget_exhausted"


@dataclass(frozen=True)
class ReservationKey:
    trial_id: str
    attempt: int

    def __post_init__(self) -> None:
        if not isinstance(self.trial_id, str) or not self.trial_id:
            raise UsageError(f"trial_id={self.trial_id!r} must be a non-empty string")
        check_number("attempt", self.attempt, integer=True)

    def __str__(self) -> str:
        return f"{self.trial_id}/{self.attempt}"


@dataclass(frozen=True)
class Reservation:
    key: ReservationKey
    gpu_hours: float  # worst case held for this attempt
    cpu_hours: float
    seq: int  # the journal entry that made it
    ok: ClassVar[Literal[True]] = True


@dataclass(frozen=True)
class Refusal:
    """A reservation the caps cannot hold: a normal outcome, the caller stops dispatching."""

    key: ReservationKey
    lines: tuple[CapLine, ...]  # the caps that would be overshot
    message: str
    outcome: BudgetOutcome = BudgetOutcome.EXHAUSTED
    ok: ClassVar[Literal[False]] = False

    def __post_init__(self) -> None:
        if not self.lines or any(line.ok for line in self.lines):
            raise ParcelError("a Refusal names only the caps it would overshoot, and at least one")


@dataclass(frozen=True)
class Settlement:
    key: ReservationKey
    state: KeyState  # SETTLED or RELEASED
    used_gpu_hours: float
    used_cpu_hours: float
    released_gpu_hours: float
    released_cpu_hours: float
    seq: int


@dataclass(frozen=True)
class Hold:
    """One attempt's reservation as the journal holds it: its worst case, and what it settled."""

    state: KeyState
    reserved_gpu_hours: float  # the worst case it reserved
    reserved_cpu_hours: float
    used_gpu_hours: float = 0.0  # what it settled (0 while held, and when released)
    used_cpu_hours: float = 0.0


@dataclass(frozen=True)
class JournalView:
    """What a reader sees in a search's journal: the running totals and every reservation."""

    totals: JournalTotals
    holds: Mapping[ReservationKey, Hold]


@dataclass(frozen=True)
class _Totals:
    """Running totals in micro-hours, as stored in every entry."""

    reserved_gpu_uh: int = 0
    reserved_cpu_uh: int = 0
    used_gpu_uh: int = 0
    used_cpu_uh: int = 0
    released_gpu_uh: int = 0
    released_cpu_uh: int = 0
    attempts: int = 0
    trials: int = 0

    def spend(self) -> JournalTotals:
        h = lambda uh: uh / UH_PER_HOUR  # noqa: E731
        return JournalTotals(
            h(self.reserved_gpu_uh),
            h(self.reserved_cpu_uh),
            h(self.used_gpu_uh),
            h(self.used_cpu_uh),
            h(self.released_gpu_uh),
            h(self.released_cpu_uh),
            self.attempts,
            self.trials,
        )


@dataclass(frozen=True)
class _Key:
    state: KeyState
    gpu: int  # reserved micro-hours
    cpu: int
    seq: int  # entry that last changed it
    used_gpu_uh: int = 0
    used_cpu_uh: int = 0


class _Invalid(Exception):
    pass


def reserve_lines(caps: BudgetCaps, totals: _Totals, new_trial: bool, gpu: int, cpu: int, key: ReservationKey) -> tuple[CapLine, ...]:
    """The caps a reservation would overshoot (empty: it fits). Pure; writer and validator share it."""
    spend = totals.spend()
    g, c = gpu / UH_PER_HOUR, cpu / UH_PER_HOUR
    tail = "the search is budget_exhausted: let running attempts settle, or raise"
    lines = [
        CapLine(
            "budget.max_trials",
            "trials",
            totals.trials,
            int(new_trial),
            caps.max_trials,
            f"{key} would be trial {totals.trials + 1} of budget.max_trials={caps.max_trials}: {tail} budget.max_trials",
        ),
        CapLine(
            "budget.gpu_hours_cap",
            "GPU-h",
            spend.committed_gpu_hours,
            g,
            caps.gpu_hours_cap,
            f"{key} needs {fmt(g)} GPU-h but budget.gpu_hours_cap={fmt(caps.gpu_hours_cap)} leaves {fmt(caps.gpu_hours_cap - spend.committed_gpu_hours)}: {tail} budget.gpu_hours_cap",
        ),
        CapLine(
            "budget.cost_cap",
            "money",
            spend.committed_cost(caps.rates),
            caps.rates.cost(g, c),
            caps.cost_cap,
            f"{key} needs {fmt(caps.rates.cost(g, c))} cost but budget.cost_cap={fmt(caps.cost_cap)} leaves {fmt(caps.cost_cap - spend.committed_cost(caps.rates))}: {tail} budget.cost_cap",
        ),
    ]
    return tuple(line for line in lines if not line.ok)


@dataclass
class _Fold:
    """What the journal says after entry ``seq``. ``propose`` and ``step`` share the transition, so a
    writer computes exactly the totals a reader will check."""

    seq: int = -1
    digest: str = ""
    totals: _Totals = _Totals()
    caps: BudgetCaps | None = None
    keys: dict[ReservationKey, _Key] = field(default_factory=dict)
    trial_ids: set[str] = field(default_factory=set)

    def _transition(self, kind: EntryKind, key: ReservationKey | None, gpu: int, cpu: int, caps: BudgetCaps | None) -> tuple[_Totals, _Key | None]:
        t, seq = self.totals, self.seq + 1
        if (kind is EntryKind.OPEN) != (seq == 0):
            raise _Invalid(f"a {kind.value} entry cannot be entry {seq}")
        if kind in (EntryKind.OPEN, EntryKind.CAPS):
            if caps is None:
                raise _Invalid(f"a {kind.value} entry must carry caps")
            return t, None
        if key is None or gpu < 0 or cpu < 0:
            raise _Invalid(f"a {kind.value} entry needs a trial_id, an attempt and hours >= 0")
        prior = self.keys.get(key)
        if kind is EntryKind.RESERVE:
            if prior is not None:
                raise _Invalid(f"{key} is reserved twice (first at entry {prior.seq})")
            assert self.caps is not None  # entry 0 (open) carried them
            if reserve_lines(self.caps, t, key.trial_id not in self.trial_ids, gpu, cpu, key):
                raise _Invalid(f"reserving {key} overshoots the caps in force")
            new_trial = int(key.trial_id not in self.trial_ids)
            t = _Totals(
                t.reserved_gpu_uh + gpu,
                t.reserved_cpu_uh + cpu,
                t.used_gpu_uh,
                t.used_cpu_uh,
                t.released_gpu_uh,
                t.released_cpu_uh,
                t.attempts + 1,
                t.trials + new_trial,
            )
            return t, _Key(KeyState.HELD, gpu, cpu, seq)
        if kind is EntryKind.RESTATE:
            if prior is None or prior.state is not KeyState.SETTLED:
                raise _Invalid(f"restate of {key}, which is {'not reserved' if prior is None else prior.state.value}: only a settled attempt is restated")
            was = max(0, prior.gpu - prior.used_gpu_uh), max(0, prior.cpu - prior.used_cpu_uh)
            now = max(0, prior.gpu - gpu), max(0, prior.cpu - cpu)
            t = _Totals(
                t.reserved_gpu_uh,
                t.reserved_cpu_uh,
                t.used_gpu_uh - prior.used_gpu_uh + gpu,
                t.used_cpu_uh - prior.used_cpu_uh + cpu,
                t.released_gpu_uh - was[0] + now[0],
                t.released_cpu_uh - was[1] + now[1],
                t.attempts,
                t.trials,
            )
            return t, _Key(KeyState.SETTLED, prior.gpu, prior.cpu, seq, gpu, cpu)
        if prior is None or prior.state is not KeyState.HELD:
            raise _Invalid(f"{kind.value} of {key}, which is {'not reserved' if prior is None else prior.state.value}")
        if kind is EntryKind.RELEASE:
            gpu, cpu = 0, 0  # nothing ran
        rel_g, rel_c = max(0, prior.gpu - gpu), max(0, prior.cpu - cpu)
        t = _Totals(
            t.reserved_gpu_uh - prior.gpu,
            t.reserved_cpu_uh - prior.cpu,
            t.used_gpu_uh + gpu,
            t.used_cpu_uh + cpu,
            t.released_gpu_uh + rel_g,
            t.released_cpu_uh + rel_c,
            t.attempts,
            t.trials,
        )
        state = KeyState.SETTLED if kind is EntryKind.SETTLE else KeyState.RELEASED
        return t, _Key(state, prior.gpu, prior.cpu, seq, gpu, cpu)

    def view(self) -> JournalView:
        h = UH_PER_HOUR
        holds = {k: Hold(v.state, v.gpu / h, v.cpu / h, v.used_gpu_uh / h, v.used_cpu_uh / h) for k, v in self.keys.items()}
        return JournalView(self.totals.spend(), holds)

    def to_json(self) -> dict:
        keys = [[k.trial_id, k.attempt, v.state.value, v.gpu, v.cpu, v.seq, v.used_gpu_uh, v.used_cpu_uh] for k, v in self.keys.items()]
        assert self.caps is not None  # folds are written after entry 0 (open), which carries them
        return {"v": JOURNAL_VERSION, "seq": self.seq, "digest": self.digest, "totals": asdict(self.totals), "caps": self.caps.to_json(), "keys": keys}

    @classmethod
    def from_json(cls, d: dict) -> _Fold:
        if d.get("v") != JOURNAL_VERSION:
            raise ValueError(f"not a version-{JOURNAL_VERSION} fold")
        keys = {ReservationKey(t, a): _Key(KeyState(st), g, c, seq, ug, uc) for t, a, st, g, c, seq, ug, uc in d["keys"]}
        return cls(d["seq"], d["digest"], _Totals(**d["totals"]), BudgetCaps.from_json(d["caps"]), keys, {k.trial_id for k in keys})

    def propose(self, kind: EntryKind, key: ReservationKey | None = None, gpu: int = 0, cpu: int = 0, caps: BudgetCaps | None = None) -> dict:
        totals, _ = self._transition(kind, key, gpu, cpu, caps)
        entry = {"v": JOURNAL_VERSION, "seq": self.seq + 1, "kind": kind.value, "prev": self.digest, "totals": asdict(totals)}
        if key is not None:
            entry.update(trial_id=key.trial_id, attempt=key.attempt, gpu_uh=gpu, cpu_uh=cpu)
        if caps is not None:
            entry["caps"] = caps.to_json()
        return entry

    def step(self, entry: object, data: bytes) -> None:
        try:
            if not isinstance(entry, dict) or entry.get("v") != JOURNAL_VERSION:
                raise _Invalid(f"is not a version-{JOURNAL_VERSION} journal entry")
            if entry.get("seq") != self.seq + 1:
                raise _Invalid(f"says seq {entry.get('seq')!r} where {self.seq + 1} belongs")
            if entry.get("prev") != self.digest:
                raise _Invalid(f"does not chain to entry {self.seq} (prev digest differs): an earlier entry was replaced")
            kind = EntryKind(entry.get("kind"))
            key = ReservationKey(entry["trial_id"], entry["attempt"]) if "trial_id" in entry else None
            caps = BudgetCaps.from_json(entry["caps"]) if "caps" in entry else None
            gpu, cpu = entry.get("gpu_uh", 0), entry.get("cpu_uh", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpu, cpu)):
                raise _Invalid("gpu_uh and cpu_uh must be integers")
            totals, record = self._transition(kind, key, gpu, cpu, caps)
            if entry.get("totals") != asdict(totals):
                raise _Invalid(f"running totals {entry.get('totals')} do not follow from entry {self.seq} (expected {asdict(totals)})")
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            raise _Invalid(f"is malformed ({type(exc).__name__}: {exc})") from None
        self.seq, self.digest, self.totals = self.seq + 1, _digest(data), totals
        if caps is not None:
            self.caps = caps
        if record is not None:
            assert key is not None  # _transition returns a record only for an entry with a key
            self.keys[key] = record
            self.trial_ids.add(key.trial_id)


@dataclass(frozen=True)
class _Done:
    result: object


@dataclass(frozen=True)
class _Write:
    entry: dict
    result: Callable[[int], object]  # seq -> what the caller returns


class BudgetLedger:
    """Reservations against one search's caps, shared by every process that sees ``search_dir``.

    ``caps=None`` opens an existing journal with the caps it records (a worker); passing caps opens
    or creates it and insists they match the journal's (the caps are frozen with the search's
    contract). ``read_totals`` reads an existing journal without writing anything (read commands)."""

    def __init__(
        self, search_dir: str | os.PathLike, caps: BudgetCaps | None = None, *, clock: Callable[[], float] = time.time, writer: str | None = None
    ) -> None:
        self.path = _journal_dir(search_dir)
        self._clock = clock
        self._writer = writer or f"{socket.gethostname()}:{os.getpid()}"
        if caps is None and not self.path.is_dir():
            raise UsageError(f"no budget journal at {self.path}: open it first with the search's BudgetCaps")
        fsio.ensure_dir(self.path)
        self._fold = _newest_checkpoint(self.path) or _Fold()
        self._refresh()
        if self._fold.caps is None:
            if caps is None:
                raise _no_caps_yet(self.path)
            self._commit(lambda f: _Done(None) if f.caps is not None else _Write(f.propose(EntryKind.OPEN, caps=caps), lambda seq: None))
        if caps is not None and caps != self._fold.caps:
            assert self._fold.caps is not None  # opened just above when it had none
            raise UsageError(
                f"budget caps {caps.to_json()} differ from the {self._fold.caps.to_json()} recorded in {self.path}:"
                " the caps are frozen with the search's contract; a changed budget needs a new search.revision"
            )

    @staticmethod
    def read_totals(search_dir: str | os.PathLike) -> JournalTotals | None:
        """The journal's totals, read without creating or writing anything; None when the search has
        no journal (nothing was ever reserved). Raises like a reader when the journal is damaged."""
        view = BudgetLedger.read(search_dir)
        return view.totals if view is not None else None

    @staticmethod
    def read(search_dir: str | os.PathLike) -> JournalView | None:
        """The journal's totals and every reservation, read without writing (read commands); None
        when the search has no journal, or one with no entry yet: a launch that is opening it this
        moment (`status --watch` of a search starting) has reserved nothing, as has an opener that
        died before entry 0 (the next launch writes it)."""
        path = _journal_dir(search_dir)
        if not path.is_dir():
            return None
        fold = _newest_checkpoint(path) or _Fold()
        _replay(fold, path)
        if fold.seq < 0:
            return None
        if fold.caps is None:
            raise _no_caps_yet(path)
        return fold.view()

    @property
    def caps(self) -> BudgetCaps:
        self._refresh()
        assert self._fold.caps is not None  # __init__ insists the journal has caps
        return self._fold.caps

    def reserve(self, trial_id: str, attempt: int, gpu_hours: float, cpu_hours: float = 0.0) -> Reservation | Refusal:
        """Hold an attempt's worst case, or refuse if a cap cannot hold it. Reserving a key that is
        already held returns the existing reservation (a requeued attempt keeps its hold)."""
        key = ReservationKey(trial_id, attempt)
        gpu, cpu = _uh("gpu_hours", gpu_hours), _uh("cpu_hours", cpu_hours)

        def decide(f: _Fold) -> _Done | _Write:
            prior = f.keys.get(key)
            if prior is not None:
                if prior.state.is_closed():
                    raise UsageError(
                        f"attempt {key} was already {prior.state.value} at entry {prior.seq} of {self.path}: a rerun must reserve under a new attempt number"
                    )
                return _Done(Reservation(key, prior.gpu / UH_PER_HOUR, prior.cpu / UH_PER_HOUR, prior.seq))
            assert f.caps is not None  # __init__ insists the journal has caps
            over = reserve_lines(f.caps, f.totals, key.trial_id not in f.trial_ids, gpu, cpu, key)
            if over:
                return _Done(Refusal(key, over, "; ".join(line.message for line in over)))
            return _Write(f.propose(EntryKind.RESERVE, key, gpu, cpu), lambda seq: Reservation(key, gpu / UH_PER_HOUR, cpu / UH_PER_HOUR, seq))

        return cast(Reservation | Refusal, self._commit(decide))  # decide's results are one of these

    def settle(
        self, reservation: Reservation | ReservationKey | tuple[str, int], used_gpu_hours: float, used_cpu_hours: float = 0.0, *, first_wins: bool = False
    ) -> Settlement:
        """Record what the attempt used and release the rest of its hold. Usage above the hold is
        recorded as measured (the hours are spent); later reservations see it. ``first_wins``: a
        hold someone else already closed (another process saw the same ending) stays as they closed
        it, and that close is returned, instead of refusing a second, different one."""
        used = _uh("used_gpu_hours", used_gpu_hours), _uh("used_cpu_hours", used_cpu_hours)
        return self._close(EntryKind.SETTLE, reservation, *used, first_wins=first_wins)

    def restate(self, reservation: Reservation | ReservationKey | tuple[str, int], used_gpu_hours: float, used_cpu_hours: float = 0.0) -> Settlement:
        """Charge a settled attempt these hours instead of what it settled (the scheduler's record of
        its run came after the settle). The same figure again writes nothing."""
        key = _key_of(reservation)
        gpu, cpu = _uh("used_gpu_hours", used_gpu_hours), _uh("used_cpu_hours", used_cpu_hours)

        def decide(f: _Fold) -> _Done | _Write:
            prior = f.keys.get(key)
            if prior is None or prior.state is not KeyState.SETTLED:
                state = "not reserved" if prior is None else prior.state.value
                raise UsageError(f"{key} is {state} in {self.path}: only a settled attempt is restated; settle it first")
            if (prior.used_gpu_uh, prior.used_cpu_uh) == (gpu, cpu):
                return _Done(Settlement(key, KeyState.SETTLED, *_close_hours(prior), prior.seq))
            return _Write(
                f.propose(EntryKind.RESTATE, key, gpu, cpu),
                lambda seq: Settlement(key, KeyState.SETTLED, *_close_hours(_Key(KeyState.SETTLED, prior.gpu, prior.cpu, seq, gpu, cpu)), seq),
            )

        return cast(Settlement, self._commit(decide))  # decide's results are Settlements

    def release(self, reservation: Reservation | ReservationKey | tuple[str, int]) -> Settlement:
        """Give back the whole hold of an attempt that never started."""
        return self._close(EntryKind.RELEASE, reservation, 0, 0)

    def held(self, trial_id: str) -> list[int]:
        """The attempts of ``trial_id`` whose reservation is still held (running, or killed before
        they could settle), oldest first."""
        self._refresh()
        return sorted(k.attempt for k, v in self._fold.keys.items() if k.trial_id == trial_id and v.state is KeyState.HELD)

    def totals(self) -> JournalTotals:
        self._refresh()
        return self._fold.totals.spend()

    def verify(self) -> JournalTotals:
        """Replay the journal from scratch, also checking that no entry lies beyond a gap."""
        names = sorted(int(m.group(1)) for m in map(_ENTRY_NAME.match, fsio.names(self.path, within=_search_of(self.path))) if m)
        if names != list(range(len(names))):
            missing = next(i for i, n in enumerate(names) if i != n)
            raise CorruptRecord(
                f"{_entry_path(self.path, missing)} is missing but later entries exist in {self.path}: the journal has a gap; restore the entry from backup"
            )
        fold = _Fold()
        with fsio.Folder.open(self.path, within=_search_of(self.path)) as journal:
            for seq in names:
                _step(fold, _entry_path(self.path, seq), journal.read_bytes(_entry_name(seq)))
        return fold.totals.spend()

    # -- the seam: everything below touches the filesystem ---------------------------------------

    def _refresh(self) -> int:
        """Apply entries appended since the last look; return how many."""
        return _replay(self._fold, self.path)

    def _commit(self, decide: Callable[[_Fold], _Done | _Write]) -> object:
        backoff = 0.0005
        for _ in range(_MAX_TRIES):
            self._refresh()
            action = decide(self._fold)
            if isinstance(action, _Done):
                return action.result
            entry = {**action.entry, "at": round(self._clock(), 3), "writer": self._writer}
            data = (fsio.canonical_json(entry) + "\n").encode()
            path = _entry_path(self.path, entry["seq"])
            if fsio.create_exclusive(path, data):
                _step(self._fold, path, data)
                if entry["seq"] > 0 and entry["seq"] % FOLD_EVERY == 0:
                    _write_fold(self._fold, self.path)
                return action.result(entry["seq"])
            # Lost the race for this seq. If the winner's entry is not visible yet (an NFS client's
            # lookup cache can lag the server's EEXIST), wait a little before deciding again.
            if self._refresh() == 0:
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.05)
        raise ParcelError(f"could not append to {self.path} after {_MAX_TRIES} tries: entries exist that this host cannot read")

    def _close(self, kind: EntryKind, ref: Reservation | ReservationKey | tuple[str, int], gpu: int, cpu: int, first_wins: bool = False) -> Settlement:
        key = _key_of(ref)
        want = KeyState.SETTLED if kind is EntryKind.SETTLE else KeyState.RELEASED

        def settlement(r: _Key, seq: int) -> Settlement:
            return Settlement(key, want, *_close_hours(r), seq)

        def decide(f: _Fold) -> _Done | _Write:
            prior = f.keys.get(key)
            if prior is None:
                raise UsageError(f"no reservation for {key} in {self.path}: reserve the attempt before you {kind.value} it")
            if prior.state is want and (kind is EntryKind.RELEASE or (prior.used_gpu_uh, prior.used_cpu_uh) == (gpu, cpu)):
                return _Done(settlement(prior, prior.seq))  # the same close again: idempotent
            if prior.state.is_closed() and first_wins:
                return _Done(Settlement(key, prior.state, *_close_hours(prior), prior.seq))
            if prior.state.is_closed():
                raise UsageError(
                    f"{key} was already {prior.state.value} at entry {prior.seq} of {self.path}"
                    f" (used {fmt(prior.used_gpu_uh / UH_PER_HOUR)} GPU-h); a second, different close is not recorded"
                )
            return _Write(f.propose(kind, key, gpu, cpu), lambda seq: settlement(_Key(want, prior.gpu, prior.cpu, seq, gpu, cpu), seq))

        return cast(Settlement, self._commit(decide))  # decide's results are Settlements


def _key_of(ref: Reservation | ReservationKey | tuple[str, int]) -> ReservationKey:
    return ref.key if isinstance(ref, Reservation) else ref if isinstance(ref, ReservationKey) else ReservationKey(*ref)


def _close_hours(r: _Key) -> tuple[float, float, float, float]:
    """A closed key's used and released hours (GPU, CPU, GPU, CPU), as a Settlement reports them."""
    h = UH_PER_HOUR
    return r.used_gpu_uh / h, r.used_cpu_uh / h, max(0, r.gpu - r.used_gpu_uh) / h, max(0, r.cpu - r.used_cpu_uh) / h


def _journal_dir(search_dir: str | os.PathLike) -> Path:
    return Path(search_dir) / "budget" / "journal"


def _search_of(journal: Path) -> Path:
    """The search directory a journal (or folds) folder is in: what every read of it stays within."""
    return journal.parent.parent


def _chains(fold: _Fold, journal: Path) -> bool:
    """Entry ``fold.seq`` is in the journal with the digest and running totals the fold holds."""
    try:
        data = fsio.read_bytes(_entry_path(journal, fold.seq), within=_search_of(journal))
        return _digest(data) == fold.digest and json.loads(data).get("totals") == asdict(fold.totals)
    except (FileNotFoundError, ValueError, AttributeError, RecursionError):
        return False


def _folds_dir(journal: Path) -> Path:
    return journal.parent / "folds"


def _write_fold(fold: _Fold, journal: Path) -> None:
    folds = fsio.ensure_dir(_folds_dir(journal))
    fsio.create_exclusive(_entry_path(folds, fold.seq), (fsio.canonical_json(fold.to_json()) + "\n").encode())


def _newest_checkpoint(journal: Path) -> _Fold | None:
    """The newest fold checkpoint whose entry is in the journal with the digest it names. One that
    does not load or chain is passed over: the entries themselves are the record, so a reader then
    replays them (and ``verify`` checks them all, folds aside)."""
    names = sorted((int(m.group(1)) for m in map(_ENTRY_NAME.match, fsio.names(_folds_dir(journal), within=_search_of(journal))) if m), reverse=True)
    for seq in names:
        try:
            fold = _Fold.from_json(json.loads(fsio.read_bytes(_entry_path(_folds_dir(journal), seq), within=_search_of(journal))))
        except (OSError, ValueError, KeyError, TypeError, RecursionError, UsageError, CorruptRecord):
            continue
        if fold.seq == seq and _chains(fold, journal):
            return fold
    return None


def _entry_path(journal: Path, seq: int) -> Path:
    return journal / _entry_name(seq)


def _entry_name(seq: int) -> str:
    return f"{seq:08d}.json"


def _replay(fold: _Fold, journal: Path) -> int:
    """Apply the entries after ``fold.seq`` that exist in ``journal``; return how many. Reads only."""
    n = 0
    try:
        opened = fsio.Folder.open(journal, within=_search_of(journal))
    except FileNotFoundError:
        return n
    with opened:
        while True:
            seq = fold.seq + 1
            try:
                data = opened.read_bytes(_entry_name(seq))
            except FileNotFoundError:
                return n
            _step(fold, _entry_path(journal, seq), data)
            n += 1


def _step(fold: _Fold, path: Path, data: bytes) -> None:
    try:
        entry = _loads(data)
        fold.step(entry, data)
    except _Invalid as exc:
        raise CorruptRecord(f"budget journal entry {path} {exc}; stop dispatching until the journal is repaired") from None


def _no_caps_yet(journal: Path) -> UsageError:
    return UsageError(f"the budget journal at {journal} has no caps yet: open it with the search's BudgetCaps")


def _uh(name: str, hours: float) -> int:
    return round(check_number(name, hours) * UH_PER_HOUR)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _loads(data: bytes) -> object:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # nested past the parser's depth too
        raise _Invalid("is not valid JSON") from None
