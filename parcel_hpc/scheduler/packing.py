"""How many trials one job runs in turn, and which trials share a job (pure).

A short trial costs less than starting the process that runs it (interpreter, imports, the
snapshot): packing runs several trials in one job. The pack size is the launcher's ``pack_size``,
or with ``auto``:

- the expected trial length is the median wall time of this search's finished attempts once it has
  ``MIN_HISTORY`` of them, otherwise the per-attempt time limit (the worst case: nothing is known);
- a pack is about ``pack_minutes`` of expected work, but never so large that fewer jobs than the
  launcher's slots (parallel local processes, array tasks at once) would be left to run. Without
  ``pack_minutes`` (the local executor's default: no queue, no preemption, no backfill to be fair
  to) the trials are split evenly over the slots.

A job's time limit is then its trials' limits added up (``job_time_limit_min``); each packed attempt
stops itself at its own limit (``worker.task``). A trial that must run alone
(``TrialRecord.runs_alone``) gets a pack of one.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parcel_hpc.governance.validation import MAX_PACK, pack_option
from parcel_hpc.ledger import AttemptEnd, TrialRecord

MIN_HISTORY = 5


@dataclass(frozen=True)
class Packing:
    size: int
    basis: str  # in words, for the launch's output and record

    def to_json(self) -> dict:
        return {"size": self.size, "basis": self.basis}


def expected_trial_s(records: Iterable[TrialRecord]) -> tuple[float | None, int]:
    """The median wall time of the search's attempts that ended with a result, and how many there were."""
    walls = [
        a.ended - a.started
        for r in records
        for a in r.attempts
        if a.started is not None and a.ended is not None and a.how in (AttemptEnd.COMPLETED, AttemptEnd.PRUNED)
    ]
    return (statistics.median(walls) if len(walls) >= MIN_HISTORY else None), len(walls)


def decide(
    option: Any,
    n_trials: int,
    slots: int,
    time_limit_min: float,
    pack_minutes: float | None,
    measured: tuple[float | None, int],
    max_job_min: float | None = None,
) -> Packing:
    """The pack size for dispatching ``n_trials`` through ``slots`` parallel jobs. ``max_job_min``:
    the longest job the scheduler accepts (a partition's MaxTime): a pack's summed limit stays under it."""
    fit = MAX_PACK if max_job_min is None else max(1, int(max_job_min // max(time_limit_min, 1e-9)))
    fixed = pack_option(option)
    if fixed is not None:
        if fixed > fit:
            return Packing(fit, f"hydra.launcher.pack_size={fixed}, cut to {fit}: {fit} x {time_limit_min:g} min is the partition's MaxTime")
        return Packing(fixed, f"hydra.launcher.pack_size={fixed}")
    by_slots = max(1, math.ceil(n_trials / max(1, slots)))
    if pack_minutes is None:
        return Packing(min(by_slots, MAX_PACK, fit), f"auto: the trials split evenly over {slots} slots")
    median, seen = measured
    if median is not None:
        expected, where = max(median, 0.1), f"median trial {median:.1f} s over {seen} finished attempts"
    else:
        expected, where = 60.0 * time_limit_min, f"the time limit, {time_limit_min:g} min (fewer than {MIN_HISTORY} finished attempts to measure)"
    by_length = max(1, int(60.0 * pack_minutes // expected))
    size = min(by_length, by_slots, MAX_PACK, fit)
    return Packing(size, f"auto: about {pack_minutes:g} min a job at {where}, {slots} slots")


def groups(trial_ids: Sequence[str], size: int, records: Mapping[str, TrialRecord] | None = None) -> list[list[str]]:
    """``trial_ids`` in packs of at most ``size``, as even as possible, dealt in turn (pack i gets
    trials i, i+k, i+2k...): the jobs running at any moment run neighbouring trials, so milestones
    reach the pruner in about the order they would without packing. A trial whose record (in
    ``records``) says it must run alone (``TrialRecord.runs_alone``) gets a pack of one."""
    alone = {t for t in trial_ids if records is not None and t in records and records[t].runs_alone()}
    rest = [t for t in trial_ids if t not in alone]
    n_packs = math.ceil(len(rest) / size) if rest else 0
    return [rest[i::n_packs] for i in range(n_packs)] + [[t] for t in trial_ids if t in alone]


def job_time_limit_min(pack_len: int, time_limit_min: int) -> int:
    """A packed job's limit: every trial in it may use its own limit."""
    return pack_len * int(time_limit_min)
