"""Proposals of a sampler that learns: made one at a time when a slot frees, each recorded
create-exclusively with what it was drawn from, and re-derivable (``parcel-hpc proposals --replay``).

    proposals/<k>.json   proposal k: the results it was told (in order), its seed, the sampler and its
                         revision, the space digest, the params it drew, the sampler's state

Proposal k becomes trial ``t<k>`` (unless its configuration is a twin's: then it is a duplicate,
as with random proposals). The record is created before the trial's spec; whoever finds a record
without its trial (a launcher that died in between) finishes it from the record, never redraws.
Two launchers that race for proposal k: one record wins, the other launcher's draw is dropped, so
one freed slot gets one proposal.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord
from parcel_hpc.governance.admission import admit_proposal
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import SearchDir, TrialRecord, TrialSpec, TrialState, TrialWriter
from parcel_hpc.propose import learning
from parcel_hpc.propose.samplers import NEEDS, SamplerSpec, revision
from parcel_hpc.propose.specs import history_free_params, sampler_of, space_of, trial_id_of, trial_spec
from parcel_hpc.worker.plan import WorkerPlan

PROPOSAL_FORMAT = "parcel-proposal/1"
ORPHAN_AFTER_S = 60.0
# A proposal is drawn in about a second at most (Optuna's TPE told 10,000 trials); a lease seen
# unchanged this long without its record is a dead or stalled asker's (a slot killed mid-draw), and
# the others wait this long for it at worst.
LEASE_S = 30.0


@dataclass(frozen=True)
class ProposalRecord:
    index: int
    sampler: SamplerSpec
    space_digest: str
    seed: int
    told: tuple[learning.ToldTrial, ...]
    params: Mapping[str, Any]
    system_attrs: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)  # the libraries that drew it
    launch_id: str = ""
    at: float = 0.0

    @property
    def trial_id(self) -> str:
        return trial_id_of(self.index)

    @property
    def history_digest(self) -> str:
        return learning.told_digest(self.told)

    def trial(self, contract: Contract) -> TrialSpec:
        """The trial this proposal becomes (unless a twin owns its configuration)."""
        return trial_spec(contract, self.index, dict(self.params), self.origin())

    def origin(self) -> dict:
        """The lineage its trial's spec (and a release packet) carries."""
        return {"sampler": self.sampler.name.value, "proposal": self.index, "history_digest": self.history_digest, "told": len(self.told)}

    def to_json(self) -> dict:
        return {
            "format": PROPOSAL_FORMAT,
            "index": self.index,
            "trial_id": self.trial_id,
            "sampler": self.sampler.to_json(),
            "space_digest": self.space_digest,
            "seed": self.seed,
            "told": [t.to_json() for t in self.told],
            "history_digest": self.history_digest,
            "params": dict(self.params),
            "system_attrs": dict(self.system_attrs),
            "versions": dict(self.versions),
            "launch_id": self.launch_id,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProposalRecord:
        if d.get("format") != PROPOSAL_FORMAT:
            raise ValueError(f"format {d.get('format')!r} is not {PROPOSAL_FORMAT}")
        told = tuple(learning.ToldTrial.from_json(t) for t in d["told"])
        record = cls(
            int(d["index"]),
            SamplerSpec.from_json(d["sampler"]),
            str(d["space_digest"]),
            int(d["seed"]),
            told,
            dict(d["params"]),
            dict(d.get("system_attrs") or {}),
            dict(d.get("versions") or {}),
            str(d.get("launch_id", "")),
            float(d.get("at", 0.0)),
        )
        if d.get("history_digest") != record.history_digest:
            raise ValueError(f"its history digest {d.get('history_digest')} does not match the results it lists ({record.history_digest})")
        return record


def versions(sampler: SamplerSpec) -> dict[str, str]:
    """The libraries this sampler draws with: a replay needs the same ones."""
    out = {}
    for lib in sorted({"numpy", *(lib for lib, _ in NEEDS.get(sampler.name, []))}):
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass  # not installed, so it drew nothing here
    return out


def load(search: SearchDir, k: int) -> ProposalRecord:
    path = search.proposal_path(k)
    try:
        return ProposalRecord.from_json(search.read_json(path))
    except OSError as exc:
        raise CorruptRecord(f"proposal {k} cannot be read from {path} ({exc.strerror}); restore it (a proposal is never redrawn)") from None
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptRecord(f"{path} is not a proposal record ({exc}); restore it (a proposal is never redrawn)") from None


def draw(record: ProposalRecord, space: Mapping[str, Mapping[str, Any]], attrs_of: Callable[[int], Mapping[str, Any]]) -> tuple[dict, dict]:
    """Draw proposal ``record.index`` from what it was told (the live draw and its replay are this one call)."""
    attrs = {t.proposal: attrs_of(t.proposal) for t in record.told if t.proposal is not None}
    return learning.ask(record.sampler, space, record.seed, record.told, attrs)


@dataclass(frozen=True)
class Made:
    record: ProposalRecord
    spec: TrialSpec | None  # None: a duplicate of ``twin``
    twin: str = ""


class Proposer:
    """Makes this launch's proposals for one search, each when the follower has a free slot."""

    def __init__(self, search: SearchDir, contract: Contract, n_trials: int, launch_id: str) -> None:
        self.search = search
        self.contract = contract
        self.sampler = sampler_of(contract)
        self.space, self.space_digest = space_of(contract)
        self.n_trials = n_trials
        self.launch_id = launch_id
        self._attrs: dict[int, Mapping[str, Any]] = {}
        self.duplicates: dict[int, str] = {}  # proposal -> the trial that owns its configuration
        self._written: set[int] = set()  # proposals whose trial spec exists
        self.stopped = ""  # why no more proposals are made before n_trials (the budget)
        self.waiting: int | None = None  # the proposal another asker was drawing when ``propose`` last asked for it
        self._lease_seen: tuple[int, tuple[int, int], float] | None = None  # (k, its lease's inode and mtime, when first seen so)

    def adopt(self, spec: TrialSpec, plan: WorkerPlan, writer: TrialWriter) -> Outcome:
        """A proposal made a trial, the one way whoever adopts it (a launcher's follower, a slot):
        admitted and its plan written (a plan it has is kept), or its refusal journaled by ``writer``."""
        outcome = admit_proposal(spec.trial_id, spec.config_hash, self.contract)
        if outcome.is_admit:
            self.search.write_plan(spec.trial_id, plan.to_json())
        else:
            writer.admission_refused(outcome, self.launch_id)
        return outcome

    def next_index(self) -> int:
        """The next proposal's number (after the highest recorded: one moved aside leaves a hole, never a clash)."""
        numbers = self.search.proposal_numbers()
        return numbers[-1] + 1 if numbers else 0

    def remaining(self) -> int:
        return 0 if self.stopped else max(0, self.n_trials - self.next_index())

    def unwritten(self) -> int:
        """Recorded proposals whose trial is not written yet (and that are no duplicate)."""
        return sum(1 for k in self.search.proposal_numbers() if self._unwritten(k))

    def _unwritten(self, k: int) -> ProposalRecord | None:
        """Proposal k's record while its trial is not written and a twin does not own its configuration."""
        if k in self.duplicates or k in self._written:
            return None
        if (self.search.trial_dir(trial_id_of(k)) / "spec.json").exists():
            self._written.add(k)  # a spec is never unwritten: each follow round need not look again
            return None
        return self._not_duplicate(load(self.search, k))

    def _not_duplicate(self, record: ProposalRecord) -> ProposalRecord | None:
        """The record, unless a twin's trial owns its configuration (then remembered as a duplicate)."""
        owner = self.search.config_owner(record.trial(self.contract).config_hash)
        if owner is not None and owner != record.trial_id:
            self.duplicates[record.index] = owner
            return None
        return record

    def _not_in(self, k: int, known: set[str]) -> list[ProposalRecord]:
        """Proposals before k whose trial the records read do not hold. Whether its spec exists is not
        asked: one written since the records were read would be told neither as a result nor as running."""
        out = []
        for j in self.search.proposal_numbers():
            if j < k and trial_id_of(j) not in known and j not in self.duplicates:
                record = self._not_duplicate(load(self.search, j))
                if record is not None:
                    out.append(record)
        return out

    def finish_orphans(self, now: float) -> list[TrialSpec]:
        """Trials of recorded proposals whose launcher died before writing them, written from the
        record. A launcher writes the trial a moment after the record, so only a record older than
        ``ORPHAN_AFTER_S`` is an orphan (a younger one is another launcher's, in flight)."""
        out = []
        for k in self.search.proposal_numbers():
            record = self._unwritten(k)
            if record is None or now - record.at < ORPHAN_AFTER_S:
                continue
            made = self._trial_of(record)
            if made.spec is not None:
                out.append(made.spec)
            else:
                self.duplicates[k] = made.twin
        return out

    def stop_if_spent(self, records: Iterable[TrialRecord]) -> bool:
        """Stop proposing once a trial's budget reservation was refused: the search's caps are spent."""
        if not self.stopped and any(r.state is TrialState.BUDGET_EXHAUSTED for r in records):
            self.stopped = "a trial's budget reservation was refused (budget_exhausted): the search's caps are spent"
        return bool(self.stopped)

    def propose(self, read_records: Callable[[], Iterable[TrialRecord]]) -> Made | None:
        """Proposal k, for a slot the caller has free, from every result known now; None when
        another asker is drawing proposal k now (``waiting``: ask again once it is recorded), when
        another recorded it first, or when no more may be made (``stopped``). k is leased before
        the records are read, so every proposal before k is recorded and either seen or told running."""
        self.waiting = None
        k = self.next_index()
        if k >= self.n_trials or self.stopped:
            return None
        if self.search.cancellation() is not None:
            self.stopped = "the search was cancelled"
            return None
        holder = {"launch_id": self.launch_id, "host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}
        held = self.search.lease_proposal(k, holder)
        if not held and self.search.proposal_lease(k) is None:
            held = self.search.lease_proposal(k, holder)  # released since: its record is written, or its asker gave up
        if self.search.proposal_path(k).exists():  # recorded (and its lease dropped) since k was read: ask for k + 1
            if held:
                self.search.drop_proposal_lease(k)
            return None
        if not held and not self._overdue(k):
            self.waiting = k
            return None
        try:
            return self._draw(k, read_records)  # a lease left unchanged for LEASE_S is drawn over, never broken
        finally:
            if held:
                self.search.drop_proposal_lease(k)

    def await_record(self, k: int, poll_s: float) -> None:
        """Sleep until proposal k is recorded, its lease is gone, or the lease is overdue: two stats a
        look, not a listing of ``proposals/``, however many slots wait."""
        while not self.search.proposal_path(k).exists() and not self._overdue(k):
            time.sleep(random.uniform(0.5, 1.5) * poll_s)

    def _overdue(self, k: int) -> bool:
        """Whether proposal k's lease is gone, or has stayed unchanged for ``LEASE_S`` by this asker's
        own clock (never the file's time against this host's: NFS clocks differ). An overdue lease is
        a dead or stalled asker's: k is drawn without it, and the record's create-exclusive write
        keeps one draw should both finish."""
        seen = self.search.proposal_lease(k)
        if seen is None:
            return True
        now = time.monotonic()
        if self._lease_seen is None or self._lease_seen[:2] != (k, seen):
            self._lease_seen = (k, seen, now)
        return now - self._lease_seen[2] >= LEASE_S

    def _draw(self, k: int, read_records: Callable[[], Iterable[TrialRecord]]) -> Made | None:
        records = list(read_records())
        if self.stop_if_spent(records):
            return None
        known = {r.trial_id for r in records}
        # Another launcher's proposals between their record and their trial: told as running.
        pending = [learning.ToldTrial(u.trial_id, learning.Told.RUNNING, dict(u.params), proposal=u.index) for u in self._not_in(k, known)]
        told = learning.told_of(records, pending)
        told = json.loads(fsio.canonical_json([t.to_json() for t in told]))  # exactly what the record will say
        seed = learning.proposal_seed(int(self.contract["search_seed"]), k)
        draft = ProposalRecord(k, self.sampler, self.space_digest, seed, tuple(map(learning.ToldTrial.from_json, told)), {})
        params, state = draw(draft, self.space, self._attrs_of)
        record = ProposalRecord(k, self.sampler, self.space_digest, seed, draft.told, params, state, versions(self.sampler), self.launch_id, time.time())
        if not self.search.write_proposal(k, record.to_json()):
            return None
        return self._trial_of(record)

    def _trial_of(self, record: ProposalRecord) -> Made:
        spec = record.trial(self.contract)
        owner = self.search.claim_config(spec.config_hash, spec.trial_id)
        if owner != spec.trial_id:
            return Made(record, None, owner)  # a twin's configuration: a duplicate, as with random proposals
        self.search.write_spec(spec)
        return Made(record, spec)

    def _attrs_of(self, k: int) -> Mapping[str, Any]:
        if k not in self._attrs:
            self._attrs[k] = load(self.search, k).system_attrs
        return self._attrs[k]


# --- replay --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    index: int
    trial_id: str
    recorded: Mapping[str, Any]
    derived: Mapping[str, Any] | None  # None: could not be re-derived (``problem`` says why)
    problem: str = ""

    @property
    def same(self) -> bool:
        return self.derived is not None and fsio.canonical_json(self.recorded) == fsio.canonical_json(self.derived)

    def difference(self) -> str:
        if self.problem:
            return self.problem
        names = sorted(set(self.recorded) | set(self.derived or {}))
        name = next(n for n in names if fsio.canonical_json(self.recorded.get(n)) != fsio.canonical_json((self.derived or {}).get(n)))
        return f"{name}: recorded {self.recorded.get(name)!r}, re-derived {(self.derived or {}).get(name)!r}"


def replay(search: SearchDir, contract: Contract) -> list[Replayed]:
    """Re-derive every proposal of the search, in order: a learning sampler's from its record alone,
    a history-free sampler's (random, qmc) from (search seed, index)."""
    sampler = sampler_of(contract)
    if sampler.learns:
        return _replay_learned(search, contract)
    moved = "" if revision(sampler.name) == sampler.revision else f"it was drawn by {sampler.revision}, this machine has {revision(sampler.name)}"
    out = []
    for tid in search.trial_ids():
        spec = search.spec(tid)
        if moved:
            out.append(Replayed(spec.index, tid, spec.params, None, moved))
            continue
        (derived,) = history_free_params(contract, spec.index, spec.index + 1)
        out.append(Replayed(spec.index, tid, spec.params, derived))
    return out


def _replay_learned(search: SearchDir, contract: Contract) -> list[Replayed]:
    space, digest = space_of(contract)
    sampler = sampler_of(contract)
    cache: dict[int, ProposalRecord] = {}

    def record(k: int) -> ProposalRecord:
        if k not in cache:
            cache[k] = load(search, k)
        return cache[k]

    current = versions(sampler)
    out = []
    for k in search.proposal_numbers():
        r = record(k)
        problem = ""
        if r.space_digest != digest:
            problem = f"it was drawn from space {r.space_digest}, the contract pins {digest}"
        elif fsio.canonical_json(r.sampler.to_json()) != fsio.canonical_json(sampler.to_json()):
            problem = "it was drawn by another sampler than the contract pins"
        else:
            moved = sorted(lib for lib, v in r.versions.items() if current.get(lib) != v)
            if moved:
                lib = moved[0]
                problem = f"it was drawn with {lib} {r.versions[lib]}, this machine has {current.get(lib, 'none')}: replay it where {lib} {r.versions[lib]} is installed"
        if problem:
            out.append(Replayed(k, r.trial_id, r.params, None, problem))
            continue
        params, state = draw(r, space, lambda j: record(j).system_attrs)
        if fsio.canonical_json(state) != fsio.canonical_json(r.system_attrs):
            out.append(Replayed(k, r.trial_id, r.params, params, "the sampler's recorded state differs from the re-derived one"))
            continue
        out.append(Replayed(k, r.trial_id, r.params, params))
    return out
