"""The budget of one search, read from its frozen contract: what a launch commits, what an attempt holds."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._admission import BudgetDecision, admit_launch, attempt_worst_case, worst_case
from ._journal import BudgetLedger, Refusal, Reservation
from ._values import BudgetCaps, Spend


def search_caps(contract: Mapping[str, Any]) -> BudgetCaps:
    return BudgetCaps.from_config(contract["budget"])


def launch_decision(contract: Mapping[str, Any], n_dispatch: int, trials_already: int, search_dir: Path | None) -> BudgetDecision:
    """Admit a launch's worst case (every attempt to its time limit) against what is already spent or held."""
    b, r = contract["budget"], contract["resources"]
    caps = search_caps(contract)
    commitment = worst_case(n_dispatch, int(r["gpus"]), int(r["cpus"]), float(r["time_limit_min"]), int(b["max_retries"]), caps.rates)
    spent = BudgetLedger.read_totals(search_dir) if search_dir is not None else None
    return admit_launch(commitment, caps, spent if spent is not None else Spend(), trials_already)


def reserve_attempt(search_dir: Path, contract: Mapping[str, Any], trial_id: str, attempt: int) -> Reservation | Refusal:
    r = contract["resources"]
    gpu_h, cpu_h = attempt_worst_case(int(r["gpus"]), int(r["cpus"]), float(r["time_limit_min"]))
    return BudgetLedger(search_dir, search_caps(contract)).reserve(trial_id, attempt, gpu_h, cpu_h)


def held_attempts(search_dir: Path, contract: Mapping[str, Any], trial_id: str) -> list[int]:
    return BudgetLedger(search_dir, search_caps(contract)).held(trial_id)


def settle_attempt(search_dir: Path, contract: Mapping[str, Any], trial_id: str, attempt: int, started: float, ended: float | None = None) -> None:
    """Settle an attempt with the hours it held its resources (start to end, the scheduler's unit of charge)."""
    r = contract["resources"]
    hours = max(0.0, ((time.time() if ended is None else ended) - started) / 3600.0)
    limit_h = float(r["time_limit_min"]) / 60.0
    hours = min(hours, limit_h)  # never more than was reserved: the scheduler kills at the limit
    BudgetLedger(search_dir, search_caps(contract)).settle((trial_id, attempt), int(r["gpus"]) * hours, int(r["cpus"]) * hours)
