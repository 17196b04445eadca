"""The budget of one search, read from its frozen contract: what a launch commits, what an attempt holds."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from parcel_hpc.budget._admission import BudgetDecision, admit_launch, attempt_worst_case, combined, worst_case
from parcel_hpc.budget._journal import BudgetLedger, Refusal, Reservation, Settlement
from parcel_hpc.budget._values import BudgetCaps, JournalTotals, counted_gpus, hours_between
from parcel_hpc.errors import ParcelError
from parcel_hpc.governance.shape import ShapePlan, TrialShape


class ContractFields(Protocol):
    """What the budget reads of a contract: its fields by name (a ``Contract``, or a plain mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


def search_caps(contract: ContractFields) -> BudgetCaps:
    return BudgetCaps.from_config(contract["budget"])


def launch_decision(
    contract: ContractFields, n_dispatch: int, trials_already: int, search_dir: Path | None, shapes: Mapping[TrialShape, int] | None = None
) -> BudgetDecision:
    """Admit a launch's worst case (every attempt to its time limit) against what is already spent or
    held. ``shapes``: how many of the ``n_dispatch`` trials are known to take each shape (their specs'
    own); the rest (a learning sampler's future proposals; all, when None) are counted at the largest
    shape any trial of the search may take."""
    b, r = contract["budget"], contract["resources"]
    caps = search_caps(contract)
    known = dict(shapes or {})
    unknown = n_dispatch - sum(known.values())
    if unknown < 0:
        raise ParcelError(f"launch_decision: {sum(known.values())} trials of known shapes among {n_dispatch} to dispatch")
    if unknown:
        largest = ShapePlan.of(r).largest  # a gang holds every rank's GPUs and CPUs
        known[largest] = known.get(largest, 0) + unknown
    parts = [worst_case(n, s.gpus, s.cpus, float(r["time_limit_min"]), int(b["max_retries"]), caps.rates) for s, n in known.items() if n] or [
        worst_case(n_dispatch, 0, 0, float(r["time_limit_min"]), int(b["max_retries"]), caps.rates)  # none: worst_case says why
    ]
    spent = BudgetLedger.read_totals(search_dir) if search_dir is not None else None
    return admit_launch(combined(parts), caps, spent if spent is not None else JournalTotals(), trials_already)


def attempt_usage(resources: Mapping[str, Any], started: float, ended: float, gpus: int | None = None) -> tuple[float, float]:
    """(GPU-hours, CPU-hours) an attempt used (pure): start to end (the scheduler's unit of charge),
    never past its time limit (the scheduler kills it there), times its CPUs and the GPUs the
    scheduler allocated (``gpus``; None: the request, as reserved; never more than the request).
    The one rule: settling a hold and counting an attempt that never reserved both use it."""
    limit_min = resources.get("time_limit_min")
    hours = hours_between(started, ended) if limit_min is None else min(hours_between(started, ended), float(limit_min) / 60.0)
    shape = TrialShape.of(resources)
    return counted_gpus(gpus, shape.gpus) * hours, shape.cpus * hours


class SearchBudget:
    """One search's reservation journal, opened with the caps its contract froze. Keep one open to
    read only what was appended since the last call (a worker does, across the trials of its pack)."""

    def __init__(self, search_dir: str | os.PathLike, contract: ContractFields) -> None:
        self.limit_min = float(contract["resources"]["time_limit_min"])
        self.ledger = BudgetLedger(search_dir, search_caps(contract))

    def reserve(self, trial_id: str, attempt: int, resources: Mapping[str, Any]) -> Reservation | Refusal:
        """Hold the attempt's worst case (every resource of its trial's own shape, ``resources``: its
        spec's, to its time limit)."""
        shape = TrialShape.of(resources)
        return self.ledger.reserve(trial_id, attempt, *attempt_worst_case(shape.gpus, shape.cpus, self.limit_min))

    def held(self, trial_id: str) -> list[int]:
        return self.ledger.held(trial_id)

    def settle(self, trial_id: str, attempt: int, resources: Mapping[str, Any], started: float, ended: float, gpus: int | None = None) -> Settlement:
        """Settle an attempt with what it used (``attempt_usage`` of its trial's ``resources``, its
        spec's); ``gpus``: what the scheduler allocated it. Idempotent across processes: a hold another process already settled (two
        launchers, ``sync`` and a new attempt may each see the same ending) stays as it was settled."""
        return self.ledger.settle((trial_id, attempt), *attempt_usage(resources, started, ended, gpus), first_wins=True)

    def restate(self, trial_id: str, attempt: int, gpu_hours: float, cpu_hours: float) -> Settlement:
        """Charge a settled attempt what the scheduler's record of its run gives it (``accounting.spend``),
        in place of what it was settled at before that record came."""
        return self.ledger.restate((trial_id, attempt), gpu_hours, cpu_hours)
