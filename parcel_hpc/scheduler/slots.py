"""Which queued trial a slot takes next, and how long a slot's job is (pure).

A slot is one job (a local process, a SLURM array task) that runs trials one after another, taking
each from the search's queue when it is free (``launch.slot``). What it takes:

- only a trial it may run now (``free_to_take``): queued by a launcher's dispatch claim, neither
  finished nor taken by another slot, and not one that must run alone (``runs_alone``: the follower
  gives those a job of their own);
- the longest expected trial whose time limit fits the slot's remaining job time (``choose``),
  ties in trial order: the long trials that decide when a search ends are started first and short
  ones fill the gaps. Fitting by the limit (the attempt stops itself there) means the slot's own
  end never cuts a trial short, so it never costs a trial a retry. A slot that has taken nothing
  yet takes its first trial (a fresh slot's job is at least one trial's time limit long), so a
  trial that fits no running slot waits for a fresh one and never starts only to be killed;
- a trial's expected length is the median wall time of its nearest finished attempts in its
  search's parameter space (numbers on a log scale where they are all positive; one in
  ``MIN_PEERS`` of them, at most ``NEIGHBOURS``), capped by its time limit; with fewer than
  ``MIN_PEERS`` finished, the time limit (the worst case).

Importing this module imports neither submitit, h5py nor pyarrow.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import AttemptEnd, TrialRecord

NEIGHBOURS = 5
MIN_PEERS = 3


@dataclass(frozen=True)
class Queued:
    """A trial waiting for a slot: dispatch ``dispatch`` of ``trial_id``."""

    trial_id: str
    dispatch: int


@dataclass(frozen=True)
class Peer:
    """A finished attempt's parameters and wall time: what an expected length is measured from."""

    params: Mapping[str, Any]
    wall_s: float


def peers(records: Iterable[TrialRecord]) -> list[Peer]:
    """Every attempt that ran to a result (completed or pruned), with its trial's parameters."""
    return [
        Peer(r.spec.params, a.ended - a.started)
        for r in records
        for a in r.attempts
        if a.started is not None and a.ended is not None and a.how in (AttemptEnd.COMPLETED, AttemptEnd.PRUNED)
    ]


def _scales(known: Sequence[Peer]) -> dict[str, tuple[bool, float, float]]:
    """For each numeric parameter: whether it is read on a log scale, and its (low, span) among peers."""
    out = {}
    names = {n for p in known for n, v in p.params.items() if _number(v)}
    for name in names:
        values = [float(p.params[name]) for p in known if _number(p.params.get(name))]
        log = all(v > 0 for v in values)
        scaled = [math.log(v) if log else v for v in values]
        out[name] = (log, min(scaled), (max(scaled) - min(scaled)) or 1.0)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _distance(a: Mapping[str, Any], b: Mapping[str, Any], scales: Mapping[str, tuple[bool, float, float]]) -> float:
    total = 0.0
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        if name in scales and _number(x) and _number(y):
            log, _, span = scales[name]
            fx, fy = float(x), float(y)  # type: ignore[arg-type]  # _number checked both
            if log and fx > 0 and fy > 0:
                fx, fy = math.log(fx), math.log(fy)
            total += ((fx - fy) / span) ** 2
        elif x != y:
            total += 1.0  # another category (or a number against a category): one whole unit apart
    return math.sqrt(total)


def expected_s(params: Mapping[str, Any], known: Sequence[Peer], limit_s: float) -> float:
    """How long a trial with ``params`` is expected to run: its nearest peers' median, at most its limit."""
    if len(known) < MIN_PEERS:
        return limit_s
    scales = _scales(known)
    k = max(1, min(NEIGHBOURS, len(known) // MIN_PEERS))  # few peers: the nearest alone, not the median of all
    nearest = sorted(known, key=lambda p: _distance(params, p.params, scales))[:k]
    return min(limit_s, statistics.median(p.wall_s for p in nearest))


def free_to_take(record: TrialRecord, dispatch: int, taken: bool, withdrawn: bool, latest: int) -> bool:
    """Whether dispatch ``dispatch`` of this trial is a slot's to take now. ``latest``: the trial's
    newest dispatch claim (an older queued one was given up for it)."""
    if taken or withdrawn or dispatch != latest or record.state.is_finished():
        return False
    if len(record.jobs) >= dispatch:
        return False  # submitted already (a slot took it, or the launcher gave it a job of its own)
    return not record.runs_alone()


@dataclass(frozen=True)
class Candidate:
    queued: Queued
    expected_s: float  # what orders the candidates: the longest first
    limit_s: float  # what must fit the slot's time left: the attempt stops itself there, never the slot


def choose(candidates: Sequence[Candidate], remaining_s: float, first: bool) -> Queued | None:
    """The longest expected trial whose time limit fits ``remaining_s``, ties in trial order; a
    slot's ``first`` trial whatever its limit (its job is at least one limit long)."""
    fitting = [c for c in candidates if first or c.limit_s <= remaining_s]
    if not fitting:
        return None
    return min(fitting, key=lambda c: (-c.expected_s, c.queued.trial_id)).queued


def slot_minutes(trials_per_slot: int, time_limit_min: int) -> int:
    """A slot's job time limit: room for ``trials_per_slot`` trials at their limit (at least one)."""
    return max(1, trials_per_slot) * int(time_limit_min)


def per_shape(queued: Mapping[TrialShape, int], live: Mapping[TrialShape, int], room: int) -> dict[TrialShape, int]:
    """Fresh slots for a search of several shapes (pure): each shape needs as many as its queued
    trials beyond its live slots; ``room`` (what the launcher may still submit) is given one slot a
    shape in turn, so one shape's many trials never starve another's."""
    need = {shape: n - live.get(shape, 0) for shape, n in queued.items() if n > live.get(shape, 0)}
    out: dict[TrialShape, int] = {}
    while room > 0 and need:
        for shape in list(need):
            if room == 0:
                break
            out[shape] = out.get(shape, 0) + 1
            room -= 1
            need[shape] -= 1
            if need[shape] == 0:
                del need[shape]
    return out
