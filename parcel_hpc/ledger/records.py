"""Trial specs and trial records: what was proposed, and the state folded from its journals.

``fold`` is a pure function from a spec and its events to a ``TrialRecord``; every reader (status,
resubmit, reconcile, selection) sees the same answer from the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .states import AttemptEnd, TrialState


@dataclass(frozen=True)
class TrialSpec:
    """A proposed trial: written once (create-exclusive) before it is dispatched."""

    trial_id: str
    index: int
    params: Mapping[str, Any]
    seed: int
    config_hash: str
    contract_digest: str
    image_digest: str
    resources: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not self.trial_id or not self.config_hash.startswith("sha256:"):
            raise ValueError(f"trial spec needs a trial_id and a sha256 config_hash, got {self.trial_id!r}, {self.config_hash!r}")

    def to_json(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "index": self.index,
            "params": dict(self.params),
            "seed": self.seed,
            "config_hash": self.config_hash,
            "contract_digest": self.contract_digest,
            "image_digest": self.image_digest,
            "resources": dict(self.resources),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "TrialSpec":
        return cls(**{k: obj[k] for k in ("trial_id", "index", "params", "seed", "config_hash", "contract_digest", "image_digest", "resources")})


@dataclass(frozen=True)
class Attempt:
    """One run of the worker for a trial (a requeue or resubmission is a new attempt)."""

    number: int
    job_id: str = ""
    host: str = ""
    pid: int = 0
    started: float | None = None
    ended: float | None = None
    how: AttemptEnd | None = None
    cause: str = ""  # interruption cause or failure class
    step: int = 0
    resumed_from: int = 0
    restart_count: int = 0
    message: str = ""


@dataclass(frozen=True)
class TrialRecord:
    spec: TrialSpec
    state: TrialState
    attempts: tuple[Attempt, ...] = ()
    jobs: tuple[str, ...] = ()  # every scheduler job id submitted for this trial, in order
    metric: float | None = None  # final validation miss-cost; only a completed trial has one
    step: int = 0  # last step reached
    milestone: int | None = None  # last milestone reported
    last_value: float | None = None  # value at that milestone (never a result by itself)
    reason: str = ""  # why it is in its state: reject:<field>, failure class, prune rule
    interrupted: int = 0
    resumed: int = 0
    failures: tuple[str, ...] = ()  # failure classes of failed attempts, in order
    quarantines: tuple[str, ...] = ()  # reasons, one per quarantine
    invalid_metrics: bool = False  # some metric of this trial came from a quarantined attempt
    tainted_upto: int = 0  # attempts numbered up to this ran in a quarantined directory

    def __post_init__(self) -> None:
        if self.state is TrialState.COMPLETED and self.metric is None:
            raise ValueError(f"{self.spec.trial_id}: a completed trial must carry its metric")
        if self.state is not TrialState.COMPLETED and self.metric is not None:
            raise ValueError(f"{self.spec.trial_id}: only a completed trial is scored")

    @property
    def trial_id(self) -> str:
        return self.spec.trial_id

    def to_json(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "state": self.state.value,
            "metric": self.metric,
            "step": self.step,
            "milestone": self.milestone,
            "last_value": self.last_value,
            "attempts": len(self.attempts),
            "interrupted": self.interrupted,
            "resumed": self.resumed,
            "reason": self.reason,
            "failures": list(self.failures),
            "quarantines": list(self.quarantines),
            "jobs": list(self.jobs),
            "params": dict(self.spec.params),
            "seed": self.spec.seed,
            "config_hash": self.spec.config_hash,
        }


_TERMINAL_ENDS = {
    AttemptEnd.COMPLETED: TrialState.COMPLETED,
    AttemptEnd.PRUNED: TrialState.PRUNED,
    AttemptEnd.REJECTED: TrialState.REJECTED,
    AttemptEnd.BUDGET_EXHAUSTED: TrialState.BUDGET_EXHAUSTED,
}


def fold(spec: TrialSpec, events: Sequence[Mapping[str, Any]]) -> TrialRecord:
    """The trial's record from its ordered events (pure)."""
    attempts: dict[int, dict] = {}
    jobs: list[str] = []
    state = TrialState.QUEUED
    metric = None
    reason = ""
    milestone = last_value = None
    failures: list[tuple[int, str]] = []  # (attempt, failure class)
    quarantines: list[str] = []
    interrupted = resumed = 0
    step = 0
    invalid = False
    tainted_upto = 0  # attempts up to this number ran in a quarantined directory: their results never count

    for ev in events:
        kind = ev["kind"]
        n = int(ev.get("attempt", 0) or 0)
        tainted = 0 < n <= tainted_upto
        if kind == "submitted":
            if ev.get("job_id") and ev["job_id"] not in jobs:
                jobs.append(ev["job_id"])
            if not state.is_finished():
                state = TrialState.QUEUED
        elif kind == "admission" and ev["outcome"] != "admit":
            state, reason = TrialState.REJECTED, ev["outcome"]
        elif kind == "started":
            a = attempts.setdefault(n, {"number": n})
            a.update(job_id=ev.get("job_id", ""), host=ev.get("host", ""), pid=ev.get("pid", 0), started=ev["t"],
                     restart_count=ev.get("restart_count", 0))
            if not state.is_finished():
                state, reason = TrialState.RUNNING, ""
        elif kind == "resumed":
            attempts.setdefault(n, {"number": n})["resumed_from"] = int(ev["step"])
            resumed += 1
        elif kind == "milestone" and not tainted:
            step = max(step, int(ev["step"]))
            if ev.get("is_milestone", True):
                milestone, last_value = int(ev["step"]), ev["value"]
        elif kind == "progress":
            step = max(step, int(ev["step"]))
        elif kind in ("ended", "resolved"):
            a = attempts.setdefault(n, {"number": n})
            if a.get("how") is not None and not (kind == "ended" and a.get("cause") == "lost"):
                continue  # the first specific word on how an attempt ended stands; a bare "lost" yields to the worker's
            superseded = any(k > n and "started" in v for k, v in attempts.items())
            how = AttemptEnd(ev["how"])
            a.update(ended=ev["t"], how=how, cause=ev.get("cause", ""), step=ev.get("step", a.get("step", 0)), message=ev.get("message", ""))
            if "step" in ev:
                step = max(step, int(ev["step"]))
            if state.is_finished() or tainted:
                continue
            if superseded and how not in (AttemptEnd.COMPLETED, AttemptEnd.PRUNED):
                continue  # a stale attempt's interruption after a newer one started changes nothing; its result still counts
            if how in _TERMINAL_ENDS:
                state = _TERMINAL_ENDS[how]
                reason = ev.get("reason", ev.get("cause", ""))
                if how is AttemptEnd.COMPLETED:
                    metric = float(ev["metric"])
            elif how is AttemptEnd.FAILED:
                failures.append((n, ev.get("cause", "exception")))
                if ev.get("final"):
                    state, reason = TrialState.FAILED, ev.get("cause", "exception")
                else:
                    state, reason = TrialState.QUEUED, f"retry: {ev.get('cause', 'exception')} once"
            elif how.is_infrastructure():
                interrupted += 1
                state, reason = TrialState.QUEUED, f"interrupted: {ev.get('cause', how.value)}"
            elif how is AttemptEnd.QUARANTINED:
                state, reason = TrialState.QUARANTINED, ev.get("reason", "")
        elif kind == "quarantined":
            quarantines.append(ev.get("reason", ""))
            tainted_upto = max(tainted_upto, int(ev.get("attempts_upto", 0)))
            # Failures in a shared directory say nothing about the design: they are withdrawn too.
            failures = [(k, c) for k, c in failures if k > tainted_upto]
            if state not in (TrialState.REJECTED, TrialState.BUDGET_EXHAUSTED):
                # A quarantined result is withdrawn, never scored: the trial is rerun cleanly.
                state, reason, metric, invalid = TrialState.QUARANTINED, ev.get("reason", ""), None, True
                milestone = last_value = None
        elif kind == "gave_up":
            if state.is_finished():
                continue  # a late give-up (a signal after the result) never overrides an ending
            state, reason = TrialState(ev.get("state", "failed")), ev.get("reason", "")
            if ev.get("cause"):
                failures.append((n, ev["cause"]))
        elif kind == "budget_exhausted":
            if not state.is_finished():
                state, reason = TrialState.BUDGET_EXHAUSTED, ev.get("reason", "budget exhausted")

    attempt_records = tuple(Attempt(**a) for _, a in sorted(attempts.items()))
    return TrialRecord(
        spec=spec, state=state, attempts=attempt_records, jobs=tuple(jobs), metric=metric, step=step,
        milestone=milestone, last_value=last_value, reason=reason, interrupted=interrupted, resumed=resumed,
        failures=tuple(c for _, c in failures), quarantines=tuple(quarantines), invalid_metrics=invalid, tainted_upto=tainted_upto,
    )
