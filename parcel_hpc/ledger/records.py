"""Trial specs and trial records: what was proposed, and the state folded from its journals.

``fold`` is the one function that turns events into a ``TrialRecord`` (pure); every reader (status,
resubmit, reconcile, selection) sees the same answer from the same files, and a writer that wants to
know what its event would change folds it first (``journal.preview``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from parcel_hpc.budget._values import counted_gpus, hours_between
from parcel_hpc.governance.admission import check_trial_id
from parcel_hpc.governance.metric import FoldScores
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger.events import (
    Accounted,
    AdmissionRefused,
    Cancelled,
    Cause,
    DeviceUse,
    Ended,
    Event,
    EventKind,
    Executor,
    FailureSignature,
    GaveUp,
    Milestone,
    Quarantined,
    Resumed,
    Started,
    Submitted,
)
from parcel_hpc.ledger.states import AttemptEnd, MetricResume, TrialState


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
    # How it was proposed (lineage): {"sampler": "random"|"qmc", "index": i} or, for a sampler that
    # learns, {"sampler": "tpe", "proposal": k, "history_digest": ..., "told": n}. None: before samplers.
    origin: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.trial_id or not self.config_hash.startswith("sha256:"):
            raise ValueError(f"trial spec needs a trial_id and a sha256 config_hash, got {self.trial_id!r}, {self.config_hash!r}")
        check_trial_id(self.trial_id)  # it names the trial's folder

    @property
    def shape(self) -> TrialShape:
        """What the trial holds: its ranks, and the GPUs and CPUs of all of them (a gang's ``resources.gpus`` is one rank's)."""
        return TrialShape.of(self.resources)

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
            "origin": None if self.origin is None else dict(self.origin),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> TrialSpec:
        fields = ("trial_id", "index", "params", "seed", "config_hash", "contract_digest", "image_digest", "resources")
        return cls(**{k: obj[k] for k in fields}, origin=obj.get("origin"))


@dataclass(frozen=True)
class Attempt:
    """One run of the worker for a trial (a requeue or resubmission is a new attempt)."""

    number: int
    job_id: str = ""
    host: str = ""
    node: str = ""  # the scheduler's name of the node it ran on (SLURMD_NODENAME; "" on the local executor)
    pid: int = 0
    started: float | None = None
    ended: float | None = None
    how: AttemptEnd | None = None
    cause: Cause | None = None  # why it ended without a plain result
    step: int = 0
    resumed_from: int = 0
    restart_count: int = 0
    message: str = ""
    gpus: int | None = None  # allocated by the scheduler; None: not recorded (the trial's request then)
    process_started: float | None = None  # when the worker process it ran in started (None: not recorded)
    error_type: str = ""  # failed: the exception's class name
    outcome: Outcome | None = None  # rejected: the worker's reject:<field>
    device_use: DeviceUse | None = None  # what it used of its GPUs, as its worker read it (None: not recorded)
    programs: tuple[str, ...] = ()  # torch.compile's programs the fence let it start, each with its count
    said: bool = False  # its own worker said how it ended (``ended``); False: someone else resolved it, or no one yet
    run: Accounted | None = None  # the scheduler's record of the run it ran in, once recorded (job_id, restart_count)

    def counted_end(self) -> float | None:
        """Where its hours end, the one rule every figure uses: its own end when its worker said how
        it ended; for one that did not (lost, resolved by someone else, or never heard of again) the
        end of its run as the scheduler recorded it (the node failure's or the requeue's moment),
        else the end the ledger gave it when the loss was noticed (a provisional figure, until the
        run is recorded). None while it runs, or before it started."""
        if self.started is None:
            return None
        if self.how is not None and self.said:
            return self.ended
        if self.run is not None:
            return max(self.started, float(self.run.end))
        return self.ended

    def settled_by_scheduler(self) -> bool:
        """Whether its end is final on a scheduler with accounting: its worker said it, or the
        scheduler's record of its run gave it (else it counts to where the ledger noticed the loss)."""
        return (self.how is not None and self.said) or self.run is not None

    def hours(self, now: float | None = None) -> float | None:
        """Its start to end in hours (a running one to ``now``); None before it started, or while it
        runs when no ``now`` is given."""
        end = self.ended if self.ended is not None else now
        return None if self.started is None or end is None else hours_between(self.started, end)

    def gpus_or(self, requested: int) -> int:
        """The GPUs its hours are counted with (``budget.counted_gpus``): what the scheduler
        allocated, never more than the request."""
        return counted_gpus(self.gpus, requested)

    def signature(self) -> FailureSignature | None:
        """What its failure was, to compare with other trials' (None unless it failed)."""
        if self.how is not AttemptEnd.FAILED or self.cause is None:
            return None
        return FailureSignature.of(self.cause, self.error_type, self.message)

    def interruption(self) -> Cause | None:
        """The cause, when this attempt spent an infrastructure retry."""
        if self.how is not None and self.how.is_infrastructure() and self.cause is not None and self.cause.counts_as_interruption():
            return self.cause
        return None


@dataclass(frozen=True)
class TrialRecord:
    spec: TrialSpec
    state: TrialState
    attempts: tuple[Attempt, ...] = ()
    jobs: tuple[str, ...] = ()  # every scheduler job id submitted for this trial, in order
    submitted_at: float | None = None  # when its latest job was recorded submitted (the submitter's clock)
    executor: Executor | None = None  # where its latest job was submitted
    metric: float | None = None  # final validation miss-cost; only a completed trial has one
    folds: FoldScores | None = None  # a completed K-fold trial's value per fold (its metric is their mean); None: no folds
    step: int = 0  # last step reached
    milestone: int | None = None  # last milestone reported
    last_value: float | None = None  # value at that milestone (never a result by itself)
    train_metrics: Mapping[str, float] = field(default_factory=dict)  # the trainer's own metrics (loss, ...) at the last step it was validated
    cause: Cause | None = None  # why it is in its state, when a cause says it (queued for a retry, failed, given up)
    detail: str = ""  # for people: reject:<field>, hold:budget, the prune rule, the quarantine
    interrupted: int = 0
    resumed: int = 0
    failures: tuple[Cause, ...] = ()  # failure classes of failed attempts, in order
    quarantines: tuple[str, ...] = ()  # reasons, one per quarantine
    invalid_metrics: bool = False  # some metric of this trial came from a quarantined attempt
    metric_resume: MetricResume = MetricResume.UNINTERRUPTED  # whether its metric is an uninterrupted run's, exactly
    tainted_upto: int = 0  # attempts numbered up to this ran in a quarantined directory
    accounted: tuple[Accounted, ...] = ()  # the scheduler's record of each run of its jobs, as recorded (one per job and run)

    def __post_init__(self) -> None:
        if self.state is TrialState.COMPLETED and self.metric is None:
            raise ValueError(f"{self.spec.trial_id}: a completed trial must carry its metric")
        if self.state is not TrialState.COMPLETED and self.metric is not None:
            raise ValueError(f"{self.spec.trial_id}: only a completed trial is scored")
        if self.folds is not None and self.metric != self.folds.mean:
            raise ValueError(f"{self.spec.trial_id}: a K-fold trial's metric is the mean over its folds")

    @property
    def trial_id(self) -> str:
        return self.spec.trial_id

    @property
    def ended_at(self) -> float | None:
        """When the trial ended, the one rule every reader uses (the report, the trials' rows, an
        exported study, the systematic-failure order): the latest end of its attempts, each where its
        hours end (``Attempt.counted_end``); None while it is not finished, or when no attempt started."""
        if not self.state.is_finished():
            return None
        return max((end for a in self.attempts if (end := a.counted_end()) is not None), default=None)

    def with_runs(self, runs: Iterable[Accounted]) -> TrialRecord:
        """The record as it reads once these runs of its jobs are recorded (pure: ``reconcile``
        settles at read time what sacct filed and the ledger has not recorded yet)."""
        mine = {r.key: r for r in self.accounted}
        mine.update((r.key, r) for r in runs if r.job_id in self.jobs or any(a.job_id == r.job_id for a in self.attempts))
        return replace(self, accounted=tuple(mine.values()), attempts=_with_runs(self.attempts, mine))

    def runs_alone(self) -> bool:
        """Whether its next run gets a job of its own, never a pack: its last attempt ended without
        saying how (its process died, maybe taking its pack with it), or failed (the retry checks
        whether that reproduces), or was quarantined; or it was dispatched and never started."""
        if not self.jobs:
            return False
        last = self.attempts[-1] if self.attempts else None
        return last is None or last.how is not AttemptEnd.INTERRUPTED

    def skipped_in_turn(self) -> bool:
        """Whether a job that runs trials in turn (a pack, a slot) passes it by, requeued or not: an
        attempt of it ran, and its next run must be a job of its own (``runs_alone``)."""
        return bool(self.attempts) and self.runs_alone()

    def awaiting_failure_check(self) -> bool:
        """Queued after a first training failure: the rerun tells whether it reproduces."""
        return self.state is TrialState.QUEUED and self.cause is not None and self.cause.is_training_failure()

    def awaiting_retry_after_interruption(self) -> bool:
        return self.state is TrialState.QUEUED and self.cause is not None and self.cause.is_infrastructure()

    def awaiting_environment(self) -> bool:
        """Queued after a worker found its environment differs from the contract (nothing ran)."""
        return self.state is TrialState.QUEUED and self.cause is Cause.DRIFT

    @property
    def error(self) -> str:
        """The first line of its last failure's error text ("" when no attempt failed)."""
        failed = [a for a in self.attempts if a.how is AttemptEnd.FAILED]
        return failed[-1].message.splitlines()[0] if failed and failed[-1].message else ""

    @property
    def reason(self) -> str:
        """Why it is in its state, in words derived from the typed fields."""
        if self.awaiting_failure_check():
            assert self.cause is not None  # awaiting_failure_check() checked it
            return f"retry: {self.cause.value} once"
        if self.awaiting_retry_after_interruption():
            assert self.cause is not None  # awaiting_retry_after_interruption() checked it
            return f"interrupted: {self.cause.value}"
        return self.detail or (self.cause.value if self.cause is not None else "")

    def to_json(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "state": self.state.value,
            "metric": self.metric,
            "fold_metrics": list(self.folds.values) if self.folds is not None else None,
            "fold_spread": self.folds.spread if self.folds is not None else None,
            "step": self.step,
            "milestone": self.milestone,
            "last_value": self.last_value,
            "train_metrics": dict(self.train_metrics),
            "attempts": len(self.attempts),
            "interrupted": self.interrupted,
            "resumed": self.resumed,
            "metric_resume": self.metric_resume.value,
            "reason": self.reason,
            "cause": self.cause.value if self.cause is not None else None,
            "error": self.error,
            "failures": [c.value for c in self.failures],
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


@dataclass
class _Fold:
    """The running state of one fold; ``fold`` is the only code that touches it."""

    spec: TrialSpec
    state: TrialState = TrialState.QUEUED
    attempts: dict[int, dict] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)
    submitted_at: float | None = None
    executor: Executor | None = None
    metric: float | None = None
    folds: FoldScores | None = None
    cause: Cause | None = None
    detail: str = ""
    milestone: int | None = None
    last_value: float | None = None
    train_metrics: dict[str, float] = field(default_factory=dict)
    failures: list[tuple[int, Cause]] = field(default_factory=list)  # (attempt, failure class)
    quarantines: list[str] = field(default_factory=list)
    interrupted: int = 0
    resumed: int = 0
    step: int = 0
    invalid: bool = False
    metric_resume: MetricResume = MetricResume.UNINTERRUPTED
    tainted_upto: int = 0  # attempts up to this number ran in a quarantined directory: their results never count
    accounted: dict[tuple[str, int], Accounted] = field(default_factory=dict)  # the latest record of each run

    def set(self, state: TrialState, cause: Cause | None = None, detail: str = "") -> None:
        self.state, self.cause, self.detail = state, cause, detail

    def attempt(self, n: int) -> dict:
        return self.attempts.setdefault(n, {"number": n})

    def record(self) -> TrialRecord:
        return TrialRecord(
            spec=self.spec,
            state=self.state,
            attempts=_with_runs((Attempt(**a) for _, a in sorted(self.attempts.items())), self.accounted),
            jobs=tuple(self.jobs),
            submitted_at=self.submitted_at,
            executor=self.executor,
            metric=self.metric,
            folds=self.folds,
            step=self.step,
            milestone=self.milestone,
            last_value=self.last_value,
            train_metrics=dict(self.train_metrics),
            cause=self.cause,
            detail=self.detail,
            interrupted=self.interrupted,
            resumed=self.resumed,
            failures=tuple(c for _, c in self.failures),
            quarantines=tuple(self.quarantines),
            invalid_metrics=self.invalid,
            metric_resume=self.metric_resume,
            tainted_upto=self.tainted_upto,
            accounted=tuple(self.accounted.values()),
        )


def _with_runs(attempts: Iterable[Attempt], runs: Mapping[tuple[str, int], Accounted]) -> tuple[Attempt, ...]:
    """Each attempt with the scheduler's record of the run it ran in (its job and restart count)."""
    return tuple(replace(a, run=runs.get((a.job_id, a.restart_count), a.run)) if a.job_id else a for a in attempts)


def counted_milestones(record: TrialRecord, events: Sequence[Event]) -> list[tuple[float, Milestone]]:
    """(when, what) its attempts reported at each step, in order, except from attempts that ran in a
    quarantined directory: those say nothing about the design (the exports' learning curves)."""
    return [(e.t, e.data) for e in events if isinstance(e.data, Milestone) and not (0 < e.attempt <= record.tainted_upto)]


def fold(spec: TrialSpec, events: Sequence[Event]) -> TrialRecord:
    """The trial's record from its ordered events (pure)."""
    f = _Fold(spec)
    for ev in events:
        n = ev.attempt
        tainted = 0 < n <= f.tainted_upto
        data = ev.data
        if isinstance(data, Submitted):
            if data.job_id and data.job_id not in f.jobs:
                f.jobs.append(data.job_id)
            f.submitted_at = ev.t
            f.executor = data.executor
            if not f.state.is_finished():
                f.state = TrialState.QUEUED
        elif isinstance(data, AdmissionRefused):
            f.set(TrialState.REJECTED, detail=str(data.outcome))
        elif isinstance(data, Started):
            if data.job_id and data.job_id not in f.jobs:
                # A job is known from its attempt too: a torn "submitted" line loses no job.
                f.jobs.append(data.job_id)
                f.executor = f.executor or data.executor
            f.attempt(n).update(
                job_id=data.job_id,
                host=data.host,
                node=data.node,
                pid=data.pid,
                started=ev.t,
                restart_count=data.restart_count,
                gpus=data.gpus,
                process_started=data.process_started,
            )
            if not f.state.is_finished():
                f.set(TrialState.RUNNING)
        elif isinstance(data, DeviceUse):
            f.attempt(n)["device_use"] = data
        elif isinstance(data, Resumed):
            f.attempt(n)["resumed_from"] = data.step
            f.resumed += 1
            if not data.exact:
                f.metric_resume = MetricResume.WITHIN_TOLERANCE
            elif f.metric_resume is MetricResume.UNINTERRUPTED:
                f.metric_resume = MetricResume.EXACT
        elif isinstance(data, Milestone):
            if not tainted:
                f.step = max(f.step, data.step)
                if data.is_milestone:
                    f.milestone, f.last_value = data.step, data.value
                if data.train and data.step >= f.step:  # the latest step's, a resumed attempt's again included
                    f.train_metrics = dict(data.train)
        elif isinstance(data, Ended):
            _fold_ending(f, ev, data, tainted)
        elif isinstance(data, Quarantined):
            f.quarantines.append(data.reason)
            f.tainted_upto = max(f.tainted_upto, data.attempts_upto)
            # Failures in a shared directory say nothing about the design: they are withdrawn too.
            f.failures = [(k, c) for k, c in f.failures if k > f.tainted_upto]
            if f.state not in (TrialState.REJECTED, TrialState.BUDGET_EXHAUSTED, TrialState.CANCELLED):
                # A quarantined result is withdrawn, never scored: the trial is rerun cleanly.
                f.set(TrialState.QUARANTINED, Cause.CHECKPOINT_COLLISION, data.reason)
                f.metric, f.folds, f.invalid = None, None, True
                f.milestone = f.last_value = None
                f.train_metrics = {}
        elif isinstance(data, GaveUp):
            if not f.state.is_finished():  # a late give-up (a signal after the result) never overrides an ending
                f.set(data.state, data.cause, data.reason)
        elif isinstance(data, Accounted):
            f.accounted[data.key] = data
        elif isinstance(data, Cancelled):
            if not f.state.is_finished():  # a trial that ended before the cancel keeps its ending
                f.set(TrialState.CANCELLED, Cause.CANCELLED_BY_OWNER, f"cancelled by {data.by}: {data.reason}")
    return f.record()


def _fold_ending(f: _Fold, ev: Event, data: Ended, tainted: bool) -> None:
    n = ev.attempt
    a = f.attempt(n)
    if a.get("how") is not None and not (ev.kind is EventKind.ENDED and a.get("cause") is Cause.LOST):
        return  # the first specific word on how an attempt ended stands; a bare "lost" yields to the worker's
    superseded = any(k > n and "started" in v for k, v in f.attempts.items())
    how = data.how
    a.update(
        ended=ev.t,
        said=ev.kind is EventKind.ENDED,
        how=how,
        cause=data.cause,
        step=data.step if data.step is not None else a.get("step", 0),
        message=data.message,
        error_type=data.error_type,
        outcome=data.outcome if how is AttemptEnd.REJECTED else None,
        programs=data.programs,
    )
    if data.step is not None:
        f.step = max(f.step, data.step)
    if f.state.is_finished() or tainted:
        return
    if superseded and how not in (AttemptEnd.COMPLETED, AttemptEnd.PRUNED):
        return  # a stale attempt's interruption after a newer one started changes nothing; its result still counts
    if data.cause is Cause.DRIFT:
        # Nothing ran against anything: the trial waits for a worker whose environment matches.
        f.set(TrialState.QUEUED, Cause.DRIFT, data.reason or str(data.outcome))
    elif how in _TERMINAL_ENDS:
        f.set(_TERMINAL_ENDS[how], data.cause, data.reason or str(data.outcome or ""))
        if how is AttemptEnd.COMPLETED:
            f.metric = data.metric
            f.folds = FoldScores(data.folds) if data.folds else None
    elif how is AttemptEnd.FAILED:
        assert data.cause is not None  # Ended.__post_init__: a failed attempt names its failure class
        f.failures.append((n, data.cause))
        f.set(TrialState.FAILED if data.final else TrialState.QUEUED, data.cause)
    elif how.is_infrastructure():
        f.interrupted += 1
        f.set(TrialState.QUEUED, data.cause)
    elif how is AttemptEnd.QUARANTINED:
        f.set(TrialState.QUARANTINED, data.cause, data.reason)
