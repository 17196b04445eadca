"""Budget values: rates, caps, spend and one cap's line in a decision.

Owns the plain, frozen values that admission and the reservation journal share, each validated at
birth (a cap that is negative, NaN or infinite cannot exist). Must not do IO or read Hydra objects
beyond picking named keys out of a mapping the caller hands over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, overload

from parcel_hpc.errors import ParcelError, UsageError

# Float sums such as 82 x 2 x 0.6 land a few ulps either side of the exact figure; a cap compares
# equal within this relative slack so that "exactly at the cap" admits.
REL_SLACK = 1e-9


def fits(total: float, cap: float) -> bool:
    return total <= cap + REL_SLACK * max(1.0, abs(cap))


def over_cap(committed: float, requested: float, cap: float) -> bool:
    # Asking for nothing never breaks a cap, even one a past overrun already broke.
    return requested > 0 and not fits(committed + requested, cap)


def fmt(x: float) -> str:
    """Hours and money for messages: one decimal at least, two at most, small values kept readable."""
    if x != 0 and abs(x) < 0.005:
        return f"{x:.3g}"
    s = f"{x:.2f}"
    return s[:-1] if s.endswith("0") else s


def fmt_minutes(x: float) -> str:
    """TRES-minutes as SLURM prints them: whole numbers bare, fractions as ``fmt`` writes them."""
    return str(int(x)) if float(x).is_integer() else fmt(x)


@overload
def check_number(name: str, value: Any, *, integer: Literal[True], minimum: float = 0.0) -> int: ...
@overload
def check_number(name: str, value: Any, *, integer: Literal[False] = False, minimum: float = 0.0) -> float: ...
@overload
def check_number(name: str, value: Any, *, integer: bool = False, minimum: float = 0.0) -> float | int: ...
def check_number(name: str, value: Any, *, integer: bool = False, minimum: float = 0.0) -> float | int:
    """``value`` as a finite number >= minimum, else a UsageError naming ``name`` (a config key)."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or not math.isfinite(value) or value < minimum:
        raise UsageError(f"{name}={value!r} must be {kind} >= {fmt(minimum) if not integer else int(minimum)}: fix it in the config")
    return int(value) if integer else float(value)


def hours_between(started: float, ended: float) -> float:
    """Start to end in hours: the scheduler's unit of charge (never negative across clock steps)."""
    return max(0.0, ended - started) / 3600.0


def counted_gpus(allocated: int | None, requested: int) -> int:
    """The GPUs an allocation's hours are counted with, everywhere parcel_hpc counts them (an
    attempt's hours, a job's start-up and gaps, a run the scheduler recorded, a selection job):
    what the scheduler allocated, never more than the request (the search reserved the request and
    its design asked for no more); None (not said): the request."""
    return requested if allocated is None else min(allocated, requested)


@dataclass(frozen=True)
class Rates:
    """What an hour costs, in the cluster's money unit."""

    per_gpu_hour: float  # money per accelerator-hour
    per_cpu_hour: float = 0.0  # money per CPU-core-hour (0 where the site bills GPUs only)

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_gpu_hour", check_number("budget.rate_per_gpu_hour", self.per_gpu_hour))
        object.__setattr__(self, "per_cpu_hour", check_number("budget.rate_per_cpu_hour", self.per_cpu_hour))

    def cost(self, gpu_hours: float, cpu_hours: float) -> float:
        return gpu_hours * self.per_gpu_hour + cpu_hours * self.per_cpu_hour

    def to_json(self) -> dict:
        return {"per_gpu_hour": self.per_gpu_hour, "per_cpu_hour": self.per_cpu_hour}


@dataclass(frozen=True)
class BudgetCaps:
    """The hard limits of one search. All finite: a site without a money cap sets a large one."""

    max_trials: int  # trials, all attempts of a trial count as one
    gpu_hours_cap: float  # accelerator-hours, reserved + used, every attempt counted
    cost_cap: float  # money, reserved + used at ``rates``
    rates: Rates

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_trials", check_number("budget.max_trials", self.max_trials, integer=True, minimum=1))
        object.__setattr__(self, "gpu_hours_cap", check_number("budget.gpu_hours_cap", self.gpu_hours_cap))
        object.__setattr__(self, "cost_cap", check_number("budget.cost_cap", self.cost_cap))
        if not isinstance(self.rates, Rates):
            raise UsageError(f"BudgetCaps.rates must be a Rates, got {type(self.rates).__name__}: build it with Rates(per_gpu_hour=...)")

    @classmethod
    def from_config(cls, budget: Mapping[str, Any]) -> BudgetCaps:
        """From the ``budget`` config group (a dict or DictConfig); ``rate_per_cpu_hour`` is optional."""
        missing = [k for k in ("max_trials", "gpu_hours_cap", "cost_cap", "rate_per_gpu_hour") if budget.get(k) is None]
        if missing:
            raise UsageError(f"budget.{missing[0]} is not set: add it to the budget config")
        rates = Rates(per_gpu_hour=budget["rate_per_gpu_hour"], per_cpu_hour=budget.get("rate_per_cpu_hour") or 0.0)
        return cls(max_trials=budget["max_trials"], gpu_hours_cap=budget["gpu_hours_cap"], cost_cap=budget["cost_cap"], rates=rates)

    def to_json(self) -> dict:
        return {"max_trials": self.max_trials, "gpu_hours_cap": self.gpu_hours_cap, "cost_cap": self.cost_cap, "rates": self.rates.to_json()}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> BudgetCaps:
        return cls(max_trials=obj["max_trials"], gpu_hours_cap=obj["gpu_hours_cap"], cost_cap=obj["cost_cap"], rates=Rates(**obj["rates"]))


@dataclass(frozen=True)
class JournalTotals:
    """Where a search's budget stands. ``reserved`` is held by attempts still running (worst case),
    ``used`` is what settled attempts measured, ``released`` what settling or releasing gave back.
    A cap binds ``reserved + used`` (the committed amount)."""

    reserved_gpu_hours: float = 0.0
    reserved_cpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    used_cpu_hours: float = 0.0
    released_gpu_hours: float = 0.0
    released_cpu_hours: float = 0.0
    attempts: int = 0  # reservations ever made (retries included)
    trials: int = 0  # distinct trials that reserved at least once

    def __post_init__(self) -> None:
        for name in ("reserved_gpu_hours", "reserved_cpu_hours", "used_gpu_hours", "used_cpu_hours", "released_gpu_hours", "released_cpu_hours"):
            object.__setattr__(self, name, check_number(f"JournalTotals.{name}", getattr(self, name)))
        for name in ("attempts", "trials"):
            check_number(f"JournalTotals.{name}", getattr(self, name), integer=True)

    @property
    def committed_gpu_hours(self) -> float:
        return self.reserved_gpu_hours + self.used_gpu_hours

    @property
    def committed_cpu_hours(self) -> float:
        return self.reserved_cpu_hours + self.used_cpu_hours

    def committed_cost(self, rates: Rates) -> float:
        return rates.cost(self.committed_gpu_hours, self.committed_cpu_hours)


@dataclass(frozen=True)
class CapLine:
    """One cap in a decision: what was committed before, what this request adds, and the cap."""

    cap_name: str  # the config key that sets the cap, e.g. "budget.gpu_hours_cap"
    unit: str  # "trials", "GPU-h" or "money"
    committed: float  # already committed before this request, in ``unit``
    requested: float  # what this request adds, in ``unit``
    cap: float  # in ``unit``
    message: str = ""  # by how much and what to change; empty when within the cap

    def __post_init__(self) -> None:
        if not self.ok and not self.message:
            raise ParcelError(f"CapLine for {self.cap_name} is over its cap but carries no message")

    @property
    def total(self) -> float:
        return self.committed + self.requested

    @property
    def left(self) -> float:
        return self.cap - self.committed

    @property
    def ok(self) -> bool:
        return not over_cap(self.committed, self.requested, self.cap)

    @property
    def overshoot(self) -> float:
        return 0.0 if self.ok else self.total - self.cap


class LimitKind(Enum):
    """SLURM association limits on TRES-minutes that a search can run into."""

    GRP_TRES_MINS = "GrpTRESMins"  # all the association's jobs ever (decayed usage): a budget
    GRP_TRES_RUN_MINS = "GrpTRESRunMins"  # minutes still held by its running jobs: a job larger never starts


@dataclass(frozen=True)
class AssociationLimit:
    """One limit of one association (an account, or a user in it) on one TRES, with what it has
    used against it, as ``sacctmgr`` and ``sshare`` report them. Minutes are TRES-minutes."""

    association: str  # "account parcel" or "user ana in account parcel"
    kind: LimitKind
    tres: str  # "gres/gpu" or "cpu"
    limit_min: float
    used_min: float = 0.0  # GrpTRESMins: the association's usage (sshare GrpTRESRaw)
    running_min: float = 0.0  # what its running jobs still hold (sshare TRESRunMins)

    def __post_init__(self) -> None:
        for name in ("limit_min", "used_min", "running_min"):
            object.__setattr__(self, name, check_number(f"AssociationLimit.{name}", getattr(self, name)))

    @property
    def name(self) -> str:
        return f"{self.association} {self.kind.value} {self.tres}={fmt_minutes(self.limit_min)}"
