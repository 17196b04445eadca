"""The budget of one search, read from its frozen contract: what a launch commits, what an attempt holds."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

from parcel_hpc.budget._admission import BudgetDecision, admit_launch, attempt_worst_case, worst_case
from parcel_hpc.budget._journal import BudgetLedger, Refusal, Reservation
from parcel_hpc.budget._values import BudgetCaps, Spend, hours_between


class ContractFields(Protocol):
    """What the budget reads of a contract: its fields by name (a ``Contract``, or a plain mapping)."""

    def __getitem__(self, key: str, /) -> Any: ...


def search_caps(contract: ContractFields) -> BudgetCaps:
    return BudgetCaps.from_config(contract["budget"])


def launch_decision(contract: ContractFields, n_dispatch: int, trials_already: int, search_dir: Path | None) -> BudgetDecision:
    """Admit a launch's worst case (every attempt to its time limit) against what is already spent or held."""
    b, r = contract["budget"], contract["resources"]
    caps = search_caps(contract)
    commitment = worst_case(n_dispatch, int(r["gpus"]), int(r["cpus"]), float(r["time_limit_min"]), int(b["max_retries"]), caps.rates)
    spent = BudgetLedger.read_totals(search_dir) if search_dir is not None else None
    return admit_launch(commitment, caps, spent if spent is not None else Spend(), trials_already)


class SearchBudget:
    """One search's reservation journal, opened with the caps its contract froze. Keep one open to
    read only what was appended since the last call (a worker does, across the trials of its pack)."""

    def __init__(self, search_dir: str | os.PathLike, contract: ContractFields) -> None:
        r = contract["resources"]
        self.gpus, self.cpus, self.limit_min = int(r["gpus"]), int(r["cpus"]), float(r["time_limit_min"])
        self.ledger = BudgetLedger(search_dir, search_caps(contract))

    def reserve(self, trial_id: str, attempt: int) -> Reservation | Refusal:
        """Hold the attempt's worst case (every resource to its time limit)."""
        return self.ledger.reserve(trial_id, attempt, *attempt_worst_case(self.gpus, self.cpus, self.limit_min))

    def held(self, trial_id: str) -> list[int]:
        return self.ledger.held(trial_id)

    def settle(self, trial_id: str, attempt: int, started: float, ended: float | None = None, gpus: int | None = None) -> None:
        """Settle an attempt with the hours it held its resources (start to end, the scheduler's unit
        of charge); ``gpus``: what the scheduler allocated it (None: the request, as reserved)."""
        hours = hours_between(started, time.time() if ended is None else ended)
        hours = min(hours, self.limit_min / 60.0)  # never more than was reserved: the scheduler kills at the limit
        held = self.gpus if gpus is None else min(gpus, self.gpus)
        self.ledger.settle((trial_id, attempt), held * hours, self.cpus * hours)
