"""The budget of one search, read from its frozen contract: what a launch commits, what an attempt holds."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from parcel_hpc.budget._admission import BudgetDecision, admit_launch, attempt_worst_case, worst_case
from parcel_hpc.budget._journal import BudgetLedger, Refusal, Reservation, Settlement
from parcel_hpc.budget._values import BudgetCaps, JournalTotals, counted_gpus, hours_between
from parcel_hpc.governance.shape import TrialShape


class ContractFields(Protocol):
    """What the budget reads of a contract: its fields by name (a ``Contract``, or a plain mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


def search_caps(contract: ContractFields) -> BudgetCaps:
    return BudgetCaps.from_config(contract["budget"])


def launch_decision(contract: ContractFields, n_dispatch: int, trials_already: int, search_dir: Path | None) -> BudgetDecision:
    """Admit a launch's worst case (every attempt to its time limit) against what is already spent or held."""
    b, r = contract["budget"], contract["resources"]
    caps = search_caps(contract)
    shape = TrialShape.of(r)  # a gang holds every rank's GPUs and CPUs
    commitment = worst_case(n_dispatch, shape.gpus, shape.cpus, float(r["time_limit_min"]), int(b["max_retries"]), caps.rates)
    spent = BudgetLedger.read_totals(search_dir) if search_dir is not None else None
    return admit_launch(commitment, caps, spent if spent is not None else JournalTotals(), trials_already)


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
        r = self.resources = contract["resources"]
        shape = TrialShape.of(r)
        self.gpus, self.cpus, self.limit_min = shape.gpus, shape.cpus, float(r["time_limit_min"])
        self.ledger = BudgetLedger(search_dir, search_caps(contract))

    def reserve(self, trial_id: str, attempt: int) -> Reservation | Refusal:
        """Hold the attempt's worst case (every resource to its time limit)."""
        return self.ledger.reserve(trial_id, attempt, *attempt_worst_case(self.gpus, self.cpus, self.limit_min))

    def held(self, trial_id: str) -> list[int]:
        return self.ledger.held(trial_id)

    def settle(self, trial_id: str, attempt: int, started: float, ended: float, gpus: int | None = None) -> Settlement:
        """Settle an attempt with what it used (``attempt_usage``); ``gpus``: what the scheduler
        allocated it. Idempotent across processes: a hold another process already settled (two
        launchers, ``sync`` and a new attempt may each see the same ending) stays as it was settled."""
        return self.ledger.settle((trial_id, attempt), *attempt_usage(self.resources, started, ended, gpus), first_wins=True)

    def restate(self, trial_id: str, attempt: int, gpu_hours: float, cpu_hours: float) -> Settlement:
        """Charge a settled attempt what the scheduler's record of its run gives it (``accounting.spend``),
        in place of what it was settled at before that record came."""
        return self.ledger.restate((trial_id, attempt), gpu_hours, cpu_hours)
