"""One attempt of one trial, start to end, with every transition journaled.

Order matters and is the point of this module:
1. admission against the frozen contract, then the worker's own check of what it actually opened;
2. the checkpoint-directory claim (a collision quarantines both trials before any training);
3. resume from the last good checkpoint, or start;
4. train; report at milestones only; the stop rule compares same-milestone peers;
5. end: completed with its metric, pruned, failed with a class, interrupted, or quarantined.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import checkpoints as ckpt
from .. import claims
from ..budget._search import reserve_attempt, settle_attempt
from ..contract import TrialIdentity, WorkerObservation, admit, check_worker
from ..data import load_partition, read_split, snapshot_digest
from ..image import image_digest
from ..ledger.states import AttemptEnd, FailureClass, TrialState
from ..ledger.store import SearchDir
from ..metric import MissCost
from ..pruning import MilestoneStore, make_pruner
from . import quarantine
from .features import featurize
from .jobenv import JobFacts
from .model import Diverged, Hyper, TrainState, init_state, predict_proba, train_step
from .plan import WorkerPlan

if TYPE_CHECKING:
    from .task import TrialTask


PREVIOUS_ATTEMPT_WAIT_S = 90.0  # SLURM's KillWait plus slurmd's cleanup, with margin


def _same_trial(exc: "claims.CheckpointCollision", plan: WorkerPlan) -> bool:
    trial = getattr(exc.theirs, "trial", None)
    return trial is not None and trial.trial_id == plan.trial_id and trial.config_hash == plan.config_hash


class StopAttempt(Exception):
    """Stop this attempt without a result; the reason is already journaled."""


class AttemptRun:
    def __init__(self, plan: WorkerPlan, facts: JobFacts, task: "TrialTask") -> None:
        self.plan = plan
        self.facts = facts
        self.task = task
        self.search = SearchDir(Path(plan.search_dir))
        record = self.search.record(plan.trial_id)
        self.prior = record
        self.attempt = self.search.claim_attempt(plan.trial_id, 1 + max((a.number for a in record.attempts), default=0))
        self.journal = self.search.journal(plan.trial_id, f"a{self.attempt}")
        self.store: ckpt.CheckpointStore | None = None
        self.milestones = MilestoneStore(self.search.path, plan.pruner["milestones"])
        self.ended = False
        self.reserved = False
        self.started_at = 0.0
        self.contract = None

    # --- the attempt --------------------------------------------------------------------------
    def execute(self) -> dict:
        plan, facts = self.plan, self.facts
        if self.prior.state.is_finished():
            # A late requeue or a duplicate dispatch of a finished trial: it never trains twice.
            return {"trial_id": plan.trial_id, "state": self.prior.state.value, "note": "already finished"}
        resumed_from = 0
        self.started_at = time.time()
        self._resolve_unended_attempt()
        self.journal.append("started", attempt=self.attempt, job_id=facts.job_id, raw_job_id=facts.raw_job_id,
                            executor=facts.executor, node=facts.node, host=facts.host, pid=facts.pid,
                            restart_count=facts.restart_count, cuda_visible_devices=facts.cuda_visible_devices)
        try:
            contract = self.contract = self.search.contract()
            self._admit(contract)
            self._reserve(contract)
            ckpt_dir = self._checkpoint_dir()
            identity = claims.TrialIdentity(plan.trial_id, plan.config_hash, contract.digest, contract["snapshot_digest"])
            claim = self._claim(ckpt_dir, identity)
            self.store = ckpt.CheckpointStore(ckpt_dir, identity, keep_last=plan.keep_last, claim=claim)
            data = self._load_data()
            state = self._resume_or_start(data["x_train"].shape[1])
            resumed_from = state.step
            if resumed_from:
                self.journal.append("resumed", attempt=self.attempt, step=resumed_from)
            result = self._train(state, data)
            claim.release()
            return result
        except claims.CheckpointCollision as exc:
            if _same_trial(exc, plan):
                # A newer attempt of this same trial took the directory over (we were presumed dead,
                # e.g. our node was set down): stop writing, it is not a collision between trials.
                self._end(AttemptEnd.LOST, cause="superseded", reason=exc.reason)
                return {"trial_id": plan.trial_id, "state": "superseded"}
            self._end(AttemptEnd.QUARANTINED, cause="checkpoint_collision", reason=str(exc))
            if not self.search.is_quarantined_attempt(plan.trial_id, self.attempt):
                # The first to find the collision quarantines both; the other attempt only stops.
                quarantine.quarantine_collision(self.search, plan.trial_id, self.attempt, exc)
            return {"trial_id": plan.trial_id, "state": TrialState.QUARANTINED.value, "reason": str(exc)}
        except StopAttempt as exc:
            return {"trial_id": plan.trial_id, "state": str(exc)}
        except Diverged as exc:
            self._fail(FailureClass.DIVERGED, exc)
            raise
        except MemoryError as exc:
            self._fail(FailureClass.OUT_OF_MEMORY, exc)
            raise
        except Exception as exc:
            self._fail(FailureClass.EXCEPTION, exc)
            raise

    def _admit(self, contract) -> None:
        plan = self.plan
        identity = TrialIdentity(plan.trial_id, plan.image_digest, contract["snapshot_digest"], contract["split_digest"],
                                 contract["metric_revision"], contract["search_revision"], plan.config_hash, plan.contract_digest)
        outcome = admit(identity, contract)
        if outcome == "admit" and plan.contract_digest != contract.digest:
            outcome = "reject:contract_digest"
        if outcome == "admit":
            split = read_split(plan.split_path)
            observed = WorkerObservation(snapshot_digest(plan.snapshot_path), split.digest, split.method.value, image_digest(plan.image))
            outcome = check_worker(observed, contract)
        if outcome != "admit":
            self._end(AttemptEnd.REJECTED, reason=outcome, cause=outcome)
            raise StopAttempt(TrialState.REJECTED.value)

    def _resolve_unended_attempt(self) -> None:
        """The previous attempt never said how it ended (killed with the node, SIGKILL): say it now."""
        last = self.prior.attempts[-1] if self.prior.attempts else None
        if last is None or last.how is not None:
            return
        cause = "requeued_by_scheduler" if self.facts.executor == "slurm" and self.facts.restart_count > last.restart_count else "lost"
        self.journal.append("resolved", attempt=last.number, how="lost", cause=cause, job_id=last.job_id,
                            message="the attempt ended without recording how; its job was requeued or resubmitted")
        self.prior = self.search.record(self.plan.trial_id)

    def _claim(self, ckpt_dir: str, identity: "claims.TrialIdentity") -> "claims.Claim":
        """Claim the directory; if an earlier attempt of this trial still runs (its node was set down
        but its process lives on), wait for it to die rather than train beside it."""
        deadline = time.monotonic() + PREVIOUS_ATTEMPT_WAIT_S
        while True:
            try:
                return claims.claim_directory(ckpt_dir, claims.ClaimIdentity.here(identity, job_id=self.facts.job_id, attempt=self.attempt))
            except claims.CheckpointCollision as exc:
                theirs = getattr(exc.theirs, "attempt", None)
                if not _same_trial(exc, self.plan) or theirs is None:
                    raise
                if theirs > self.attempt:
                    self._end(AttemptEnd.LOST, cause="superseded", reason=exc.reason)
                    raise StopAttempt("superseded")
                if time.monotonic() > deadline:
                    self._end(AttemptEnd.INTERRUPTED, cause="previous_attempt_alive", reason=exc.reason)
                    raise StopAttempt("previous_attempt_alive")
                time.sleep(2.0)

    def _reserve(self, contract) -> None:
        """Hold this attempt's worst case before using anything; a full budget ends the trial normally."""
        held = reserve_attempt(self.search.path, contract, self.plan.trial_id, self.attempt)
        if not held.ok:
            self._end(AttemptEnd.BUDGET_EXHAUSTED, reason=f"hold:budget: {held.message}")
            raise StopAttempt(TrialState.BUDGET_EXHAUSTED.value)
        self.reserved = True

    def _checkpoint_dir(self) -> str:
        if self.prior.quarantines:
            # A quarantined trial reruns in a directory nobody else can have been pointed at, named
            # by its quarantine generation, so a preempted clean rerun resumes its own checkpoints.
            clean = self.search.path / "checkpoints-clean" / f"{self.plan.trial_id}-q{self.prior.tainted_upto}"
            return str(clean)
        return self.plan.checkpoint_dir()

    def _load_data(self) -> dict:
        plan = self.plan
        split = read_split(plan.split_path)
        train = load_partition(plan.snapshot_path, split, "train")
        val = load_partition(plan.snapshot_path, split, "validation")
        x_train, (x_val,) = featurize(train.images, [val.images], plan.preprocessing["revision"], int(plan.preprocessing["pool"]))
        return {"x_train": x_train, "y_train": train.labels, "x_val": x_val, "y_val": val.labels}

    def _resume_or_start(self, n_features: int) -> TrainState:
        latest = self.store.load_latest()
        for problem in self.store.problems:
            self.journal.append("checkpoint_skipped", attempt=self.attempt, path=str(problem.path), reason=problem.reason)
        if latest is None:
            return init_state(n_features, self._hyper(), self.plan.seed)
        return TrainState(latest.step, dict(latest.params), dict(latest.optimizer), latest.rng_state)

    def _hyper(self) -> Hyper:
        # Unweighted loss keeps probabilities calibrated; the metric's threshold applies the costs.
        return Hyper.from_params(self.plan.params, pos_weight=1.0)

    def _train(self, state: TrainState, data: dict) -> dict:
        plan = self.plan
        hyper = self._hyper()
        metric = MissCost(plan.metric["revision"], float(plan.metric["miss_cost"]), float(plan.metric["review_cost"]))
        pruner = make_pruner(plan.pruner)
        milestones = set(int(m) for m in plan.pruner["milestones"])
        fault = str(plan.params.get("fault", "none"))
        self.task._state = state
        value = math.nan
        while state.step < plan.steps:
            step_started = time.monotonic()
            state = train_step(state, data["x_train"], data["y_train"], hyper)
            if fault == "raise" and state.step == 5:
                raise RuntimeError("injected fault: params.fault=raise")
            if fault == "nan" and state.step == 5:
                raise Diverged("injected fault: params.fault=nan")
            self.task._state = state  # one reference swap: a signal handler always sees a whole state
            if plan.step_seconds > 0:
                time.sleep(max(0.0, plan.step_seconds - (time.monotonic() - step_started)))
            if state.step % plan.every_steps == 0 or state.step == plan.steps:
                self._save(state)
            if state.step in milestones or state.step == plan.steps:
                value = metric(predict_proba(state.params, data["x_val"]), data["y_val"])
                if not math.isfinite(value):
                    raise Diverged(f"validation metric is {value} at step {state.step}")
                self._milestone(state.step, value, pruner, final=state.step == plan.steps)
        if not math.isfinite(value):  # resumed from the final checkpoint: score the state it holds
            value = metric(predict_proba(state.params, data["x_val"]), data["y_val"])
            if not math.isfinite(value):
                raise Diverged(f"validation metric is {value} at step {state.step}")
            self._milestone(state.step, value, pruner, final=True)
        self._end(AttemptEnd.COMPLETED, metric=value, step=state.step)
        return {"trial_id": plan.trial_id, "state": TrialState.COMPLETED.value, "metric": value, "step": state.step}

    def _milestone(self, step: int, value: float, pruner, final: bool) -> None:
        self._stop_if_quarantined()
        is_milestone = self.milestones.report(self.plan.trial_id, step, value, self.attempt)
        self.journal.append("milestone", attempt=self.attempt, step=step, value=value, is_milestone=is_milestone)
        if final or not is_milestone:
            return
        decision = self.milestones.decide(pruner, self.plan.trial_id, step)
        if decision.action.stops_trial:
            self._end(AttemptEnd.PRUNED, step=step, reason=f"pruned at milestone {step}: {value:.4f} > threshold {decision.threshold:.4f}",
                      milestone=step, value=value)
            raise StopAttempt(TrialState.PRUNED.value)

    def _save(self, state: TrainState) -> None:
        self.store.save(state.step, state.params, state.opt, state.rng_state)

    def _stop_if_quarantined(self) -> None:
        if self.search.is_quarantined_attempt(self.plan.trial_id, self.attempt):
            self._end(AttemptEnd.QUARANTINED, cause="checkpoint_collision", reason="quarantined while running")
            raise StopAttempt(TrialState.QUARANTINED.value)

    # --- endings ------------------------------------------------------------------------------
    def _end(self, how: AttemptEnd, **fields: Any) -> None:
        if not self.ended:
            self.journal.append("ended", attempt=self.attempt, how=how.value, **fields)
            self.ended = True  # only once it is on disk
            if self.reserved:
                settle_attempt(self.search.path, self.contract, self.plan.trial_id, self.attempt, self.started_at)

    def _fail(self, cls: FailureClass, exc: BaseException) -> None:
        step = self.task._state.step if self.task._state is not None else 0
        prior_same = sum(1 for f in self.prior.failures if f == cls.value)
        # A configuration that fails twice with the same class is a result about the design.
        self._end(AttemptEnd.FAILED, cause=cls.value, final=prior_same >= 1, step=step,
                  message=f"{type(exc).__name__}: {exc}"[:500])

    def interrupt(self, cause: str) -> bool:
        """On the scheduler's signal: checkpoint, record, and say whether to requeue."""
        if self.ended:
            return False  # the attempt already ended (a result, a rejection): nothing to requeue
        state = self.task._state
        if state is not None and self.store is not None and state.step > 0:
            try:
                self._save(state)
            except claims.CheckpointCollision:
                return False
        step = state.step if state is not None else 0
        self._end(AttemptEnd.INTERRUPTED, cause=cause, step=step)
        # Preemption is the cluster's choice, not the trial's: it has its own, larger allowance.
        from ..lifecycle import interruption_counts

        preempted, other = interruption_counts(self.prior)
        preempted, other = (preempted + 1, other) if cause == "preempted" else (preempted, other + 1)
        if preempted > self.plan.max_preemptions or other > self.plan.max_retries:
            limit = f"{preempted} preemptions > budget.max_preemptions={self.plan.max_preemptions}" if preempted > self.plan.max_preemptions \
                else f"{other} interruptions > budget.max_retries={self.plan.max_retries}"
            self.journal.append("gave_up", state=TrialState.FAILED.value, cause="retries_exhausted", reason=limit)
            return False
        return True
