"""Launch admission: the worst case a search can spend, checked against its caps before dispatch.

Owns ``worst_case`` (n_trials x (1 + max_retries) attempts x the time limit), ``admit_launch`` (pure:
plain values in, a ``BudgetDecision`` out, with a one-line message naming the overshoot and the
config keys that would fix it) and ``render_commitment`` (the text the launch prints).

Must not read files, the clock or the journal: the caller passes what is already committed.

Accelerator-hours count ``gpus x hours``; a zero-GPU trial (a laptop run) commits no GPU-hours but
still counts against ``budget.max_trials`` and costs its CPU-hours at ``rates.per_cpu_hour``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from parcel_hpc.budget._values import (
    REL_SLACK,
    AssociationLimit,
    BudgetCaps,
    CapLine,
    JournalTotals,
    LimitKind,
    Rates,
    check_number,
    fmt,
    fmt_minutes,
    over_cap,
)
from parcel_hpc.errors import ParcelError, UsageError
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome


@dataclass(frozen=True)
class Commitment:
    """The most a launch can spend if every attempt runs to its time limit."""

    trials: int
    attempts: int  # trials x attempts_per_trial
    gpu_hours: float
    cpu_hours: float
    cost: float
    gpus: int  # per attempt (trials of several shapes: the largest attempt's)
    cpus: int  # per attempt (the same)
    time_limit_min: float  # per attempt
    max_retries: int  # per trial, for infrastructure interruptions
    rates: Rates
    shapes: int = 1  # trial shapes in the launch (``combined``): more than one, an attempt holds up to gpus and cpus

    def __post_init__(self) -> None:
        if self.attempts != self.trials * self.attempts_per_trial:
            raise ParcelError(f"Commitment.attempts={self.attempts} is not trials x (1 + max_retries); build it with worst_case()")

    @property
    def attempts_per_trial(self) -> int:
        return 1 + self.max_retries

    @property
    def hours_per_attempt(self) -> float:
        return self.time_limit_min / 60.0

    @property
    def attempt_gpu_hours(self) -> float:
        return self.gpus * self.hours_per_attempt

    @property
    def attempt_cpu_hours(self) -> float:
        return self.cpus * self.hours_per_attempt


def attempt_worst_case(gpus: int, cpus: int, time_limit_min: float) -> tuple[float, float]:
    """(GPU-hours, CPU-hours) one attempt reserves: its resources for its whole time limit."""
    gpus = check_number("resources.gpus", gpus, integer=True)
    cpus = check_number("resources.cpus", cpus, integer=True)
    time_limit_min = check_number("resources.time_limit_min", time_limit_min)
    if time_limit_min <= 0:
        raise UsageError(f"resources.time_limit_min={time_limit_min!r} must be > 0: set the per-attempt time limit in minutes")
    return gpus * time_limit_min / 60.0, cpus * time_limit_min / 60.0


def worst_case(n_trials: int, gpus: int, cpus: int, time_limit_min: float, max_retries: int, rates: Rates) -> Commitment:
    n_trials = check_number("search.n_trials", n_trials, integer=True, minimum=1)
    max_retries = check_number("budget.max_retries", max_retries, integer=True)
    gpu_h, cpu_h = attempt_worst_case(gpus, cpus, time_limit_min)
    attempts = n_trials * (1 + max_retries)
    return Commitment(
        trials=n_trials,
        attempts=attempts,
        gpu_hours=attempts * gpu_h,
        cpu_hours=attempts * cpu_h,
        cost=rates.cost(attempts * gpu_h, attempts * cpu_h),
        gpus=int(gpus),
        cpus=int(cpus),
        time_limit_min=float(time_limit_min),
        max_retries=max_retries,
        rates=rates,
    )


def combined(parts: Sequence[Commitment]) -> Commitment:
    """One launch's worst case from its trials' of each shape (same time limit, retries and rates):
    the hours and cost summed exactly, an attempt's GPUs and CPUs the largest's (what one job holds)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    return Commitment(
        trials=sum(p.trials for p in parts),
        attempts=sum(p.attempts for p in parts),
        gpu_hours=sum(p.gpu_hours for p in parts),
        cpu_hours=sum(p.cpu_hours for p in parts),
        cost=sum(p.cost for p in parts),
        gpus=max(p.gpus for p in parts),
        cpus=max(p.cpus for p in parts),
        time_limit_min=first.time_limit_min,
        max_retries=first.max_retries,
        rates=first.rates,
        shapes=len(parts),
    )


@dataclass(frozen=True)
class BudgetDecision:
    outcome: Outcome  # admit or hold:budget
    lines: tuple[CapLine, ...]  # trials, GPU-hours, cost, in that order
    message: str  # one line; on hold, every overshot cap with what to change
    commitment: Commitment

    def __post_init__(self) -> None:
        if self.outcome.is_admit != all(line.ok for line in self.lines):
            raise ParcelError(f"BudgetDecision outcome {self.outcome} contradicts its cap lines")

    @property
    def ok(self) -> bool:
        return self.outcome.is_admit

    def require(self) -> None:
        """Raise the governance refusal the launch exits with (code 3) when held."""
        if not self.ok:
            raise GovernanceRefusal(self.outcome, self.message)


def admit_launch(commitment: Commitment, caps: BudgetCaps, already_committed: JournalTotals = JournalTotals(), trials_already: int = 0) -> BudgetDecision:
    trials_already = check_number("trials_already", trials_already, integer=True)
    lines = (
        _trials_line(commitment, caps, trials_already),
        _gpu_line(commitment, caps, already_committed),
        _cost_line(commitment, caps, already_committed),
    )
    over = [line for line in lines if not line.ok]
    if over:
        return BudgetDecision(Outcome.HOLD_BUDGET, lines, "; ".join(line.message for line in over), commitment)
    c = commitment
    msg = f"{c.trials} trials, worst case {fmt(c.gpu_hours)} GPU-h and {fmt(c.cost)} cost fit within budget.gpu_hours_cap={fmt(caps.gpu_hours_cap)} and budget.cost_cap={fmt(caps.cost_cap)}"
    return BudgetDecision(Outcome.ADMIT, lines, msg, commitment)


def _trials_line(c: Commitment, caps: BudgetCaps, already: int) -> CapLine:
    name, cap, total = "budget.max_trials", caps.max_trials, already + c.trials
    if not over_cap(already, c.trials, cap):
        return CapLine(name, "trials", already, c.trials, cap)
    room = cap - already
    head = f"{c.trials} trials with {already} already in the search make {total}, over {name}={cap} by {total - cap}"
    fix = f"lower search.n_trials to {room} or raise {name} to {total}" if room > 0 else f"raise {name} to {total}"
    return CapLine(name, "trials", already, c.trials, cap, f"{head}: {fix}")


def _gpu_line(c: Commitment, caps: BudgetCaps, spend: JournalTotals) -> CapLine:
    name, committed, cap = "budget.gpu_hours_cap", spend.committed_gpu_hours, caps.gpu_hours_cap
    if not over_cap(committed, c.gpu_hours, cap):
        return CapLine(name, "GPU-h", committed, c.gpu_hours, cap)
    shape = f"{c.trials} trials x {c.attempts_per_trial} attempts x {c.gpus} GPU x {fmt(c.hours_per_attempt)} h"
    msg = _over_message(name, committed, c.gpu_hours, cap, c, shape, per_hour=float(c.gpus), unit=" GPU-h")
    return CapLine(name, "GPU-h", committed, c.gpu_hours, cap, msg)


def _cost_line(c: Commitment, caps: BudgetCaps, spend: JournalTotals) -> CapLine:
    name, committed, cap = "budget.cost_cap", spend.committed_cost(c.rates), caps.cost_cap
    if not over_cap(committed, c.cost, cap):
        return CapLine(name, "money", committed, c.cost, cap)
    per_hour = c.rates.cost(c.gpus, c.cpus)  # money per attempt-hour
    shape = (
        f"{c.trials} trials x {c.attempts_per_trial} attempts x {fmt(c.hours_per_attempt)} h x {fmt(per_hour)}/h"
        f" = {c.gpus} GPU x {fmt(c.rates.per_gpu_hour)} + {c.cpus} CPU x {fmt(c.rates.per_cpu_hour)}"
    )
    msg = _over_message(name, committed, c.cost, cap, c, shape, per_hour=per_hour, unit="")
    return CapLine(name, "money", committed, c.cost, cap, msg)


def _over_message(name: str, committed: float, requested: float, cap: float, c: Commitment, shape: str, *, per_hour: float, unit: str) -> str:
    """``per_hour`` is what one attempt adds per hour of its time limit, in the cap's unit."""
    left = cap - committed
    spent = f" ({fmt(committed)} of {fmt(cap)} already committed)" if committed > 0 else ""
    over = committed + requested - cap
    head = f"needs {fmt(requested)}{unit} worst case ({shape}) but the cap leaves {fmt(left)}{unit}{spent}, over by {fmt(over)}{unit}"
    fixes = []
    if left > 0:
        hours = c.hours_per_attempt
        n_fit = _floor(left / (c.attempts_per_trial * per_hour * hours))
        if 0 < n_fit < c.trials:
            fixes.append(f"search.n_trials to {n_fit}")
        t_fit = _floor(left * 60.0 / (c.attempts * per_hour))
        if 0 < t_fit < c.time_limit_min:
            fixes.append(f"resources.time_limit_min to {t_fit}")
        r_fit = _floor(left / (c.trials * per_hour * hours)) - 1
        if 0 <= r_fit < c.max_retries:
            fixes.append(f"budget.max_retries to {r_fit}")
    raise_fix = f"raise {name} to {fmt(committed + requested)}"
    return f"{head}: " + (f"lower {', '.join(fixes)}, or {raise_fix}" if fixes else raise_fix)


def _floor(x: float) -> int:
    return math.floor(x + REL_SLACK * max(1.0, abs(x)))


def admit_account(commitment: Commitment, limits: Sequence[AssociationLimit], account: str, job_minutes: float | None = None) -> BudgetDecision:
    """The launch's worst case against the SLURM association limits it is charged under (pure): a
    GrpTRESMins the worst case would overshoot, with the association's usage and its running jobs'
    minutes, holds it; so does a GrpTRESRunMins smaller than one job (that job would never start).
    ``job_minutes``: the longest job's time limit (a packed job runs several trials), else one trial's."""
    job_minutes = commitment.time_limit_min if job_minutes is None else job_minutes
    lines = tuple(_association_line(commitment, limit, job_minutes) for limit in limits)
    over = [line for line in lines if not line.ok]
    if over:
        return BudgetDecision(Outcome.HOLD_BUDGET, lines, "; ".join(line.message for line in over), commitment)
    said = (
        f"the worst case fits the association limits of account {account}"
        if lines
        else f"account {account} has no GrpTRESMins or GrpTRESRunMins on GPUs or CPUs"
    )
    return BudgetDecision(Outcome.ADMIT, lines, said, commitment)


def _association_line(c: Commitment, limit: AssociationLimit, job_minutes: float) -> CapLine:
    gpu = limit.tres.startswith("gres/gpu")  # typed (gres/gpu:a100) too: the job's GPUs may be of that type
    per = c.gpus if gpu else c.cpus
    unit = "GPU-min" if gpu else "CPU-min"
    coordinator = "or ask the account's coordinator to raise it (sacctmgr modify)"
    if limit.kind is LimitKind.GRP_TRES_MINS:
        # Trials of several shapes hold different GPUs: then every attempt's own minutes, the hours x 60.
        every = per * c.time_limit_min * c.attempts if c.shapes == 1 else (c.gpu_hours if gpu else c.cpu_hours) * 60.0
        committed, requested = limit.used_min + limit.running_min, every
        if not over_cap(committed, requested, limit.limit_min):
            return CapLine(limit.name, unit, committed, requested, limit.limit_min)
        msg = (
            f"{limit.name}: {fmt_minutes(limit.used_min)} {unit} used and {fmt_minutes(limit.running_min)} held by running jobs leave {fmt_minutes(limit.limit_min - committed)},"
            f" but this launch's worst case needs {fmt_minutes(requested)} ({c.trials} trials x {c.attempts_per_trial} attempts x {per} x {fmt_minutes(c.time_limit_min)} min):"
            f" lower search.n_trials, resources.time_limit_min or budget.max_retries, {coordinator}"
        )
        return CapLine(limit.name, unit, committed, requested, limit.limit_min, msg)
    requested = per * job_minutes  # what one job holds when it starts
    if not over_cap(0.0, requested, limit.limit_min):
        return CapLine(limit.name, unit, 0.0, requested, limit.limit_min)
    msg = (
        f"{limit.name}: one job holds {fmt_minutes(requested)} {unit} when it starts ({per} x {fmt_minutes(job_minutes)} min), more than the limit,"
        f" so it would wait in the queue forever: lower resources.time_limit_min{', hydra.launcher.pack_size' if job_minutes > c.time_limit_min else ''} or resources.{'gpus' if per == c.gpus else 'cpus'}, {coordinator}"
    )
    return CapLine(limit.name, unit, 0.0, requested, limit.limit_min, msg)


def render_commitment(decision: BudgetDecision) -> str:
    """The table the launch prints before dispatching: the worst case against each cap."""
    c = decision.commitment
    retries = f"1 + {c.max_retries} retr{'y' if c.max_retries == 1 else 'ies'}"
    head = (
        f"budget: {c.trials} trials x {c.attempts_per_trial} attempts ({retries}) x {fmt(c.hours_per_attempt)} h limit,"
        f" {'up to ' if c.shapes > 1 else ''}"
        f"{c.gpus} GPU + {c.cpus} CPU per attempt = worst case {fmt(c.gpu_hours)} GPU-h, {fmt(c.cpu_hours)} CPU-h, {fmt(c.cost)} cost"
    )
    return _cap_table(head, decision)


def render_account(decision: BudgetDecision, account: str) -> str:
    """The account's association limits against the same worst case."""
    if not decision.lines:
        return f"account {account}: => {decision.outcome}: {decision.message}"
    return _cap_table(f"account {account}: the association limits this launch is charged under", decision)


def _cap_table(head: str, decision: BudgetDecision) -> str:
    rows = [("cap", "committed", "this launch", "total", "cap", "left after")]
    for line in decision.lines:
        num = (lambda x: str(int(x))) if line.unit == "trials" else fmt_minutes if line.unit.endswith("-min") else fmt
        after = num(line.cap - line.total) if line.ok else f"OVER by {num(line.overshoot)}"
        rows.append((f"{line.cap_name} ({line.unit})", num(line.committed), num(line.requested), num(line.total), num(line.cap), after))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    body = ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join([head, *body, f"=> {decision.outcome}: {decision.message}"])
