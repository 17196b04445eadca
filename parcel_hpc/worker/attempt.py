"""One attempt of one trial, start to end, with every transition journaled.

Order matters and is the point of this module:
1. admission against the frozen contract, then the worker's own check of what it actually opened;
2. the checkpoint-directory claim (a collision quarantines both trials before any training);
3. resume from the last good checkpoint, or start;
4. train (``training.py``); report at milestones only; the stop rule compares same-milestone peers;
5. end: completed with its metric, pruned, failed with a class, interrupted, or quarantined.

The attempt is the only holder of its training state: the loop hands each new state back through a
callback, and ``interrupt`` (the scheduler's signal) checkpoints that state.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from .. import checkpoints as ckpt
from .. import claims
from ..budget import reserve_attempt, settle_attempt
from ..contract import Contract, TrialIdentity, WorkerObservation, admit, check_worker
from ..data import load_partition, read_split, snapshot_digest
from ..image import image_digest
from ..ledger import AttemptEnd, Cause, Ended, SearchDir, Started, TrialState
from ..lifecycle import interruption_counts, previous_attempt_ending
from ..pruning import MilestoneStore, make_pruner
from . import quarantine
from .features import featurize
from .model import Diverged, TrainState, init_state
from .plan import WorkerPlan
from .training import LoopCallbacks, hyper_of, step_hooks, train

PREVIOUS_ATTEMPT_WAIT_S = 90.0  # SLURM's KillWait plus slurmd's cleanup, with margin


def _same_trial(exc: claims.CheckpointCollision, plan: WorkerPlan) -> bool:
    trial = exc.their_trial
    return trial is not None and trial.trial_id == plan.trial_id and trial.config_hash == plan.config_hash


class StopAttempt(Exception):
    """Stop this attempt without a result; the reason is already journaled."""


class AttemptRun:
    def __init__(self, plan: WorkerPlan, facts: Started) -> None:
        self.plan = plan
        self.facts = facts
        self.search = SearchDir(Path(plan.search_dir))
        record = self.search.record(plan.trial_id)
        self.prior = record
        self.attempt = self.search.claim_attempt(plan.trial_id, 1 + max((a.number for a in record.attempts), default=0))
        self.ledger = self.search.writer(plan.trial_id, f"a{self.attempt}")
        self.store: ckpt.CheckpointStore | None = None
        self.milestones = MilestoneStore(self.search.path, plan.pruner["milestones"])
        self.pruner = make_pruner(plan.pruner)
        self.current: TrainState | None = None  # the newest whole training state
        self.ended = False
        self.reserved = False
        self.started_at = 0.0
        self.contract: Contract | None = None

    # --- the attempt --------------------------------------------------------------------------
    def execute(self) -> dict:
        plan = self.plan
        if self.prior.state.is_finished():
            # A late requeue or a duplicate dispatch of a finished trial: it never trains twice.
            return {"trial_id": plan.trial_id, "state": self.prior.state.value, "note": "already finished"}
        self.started_at = time.time()
        self._resolve_unended_attempt()
        self.ledger.started(self.attempt, self.facts)
        try:
            contract = self.contract = self.search.contract()
            self._admit(contract)
            self._reserve(contract)
            # The claim fields only: claims and checkpoint headers store and compare exactly these.
            identity = TrialIdentity(plan.trial_id, plan.config_hash, contract.digest, contract["snapshot_digest"])
            ckpt_dir = self._checkpoint_dir()
            claim = self._claim(ckpt_dir, identity)
            self.store = ckpt.CheckpointStore(ckpt_dir, identity, keep_last=plan.keep_last, claim=claim)
            data = self._load_data()
            state = self._resume_or_start(data["x_train"].shape[1])
            if state.step:
                self.ledger.resumed(self.attempt, state.step)
            state, value = train(plan, state, data, LoopCallbacks(self._hold, self._save, self._validated), step_hooks())
            self._end(Ended(AttemptEnd.COMPLETED, metric=value, step=state.step))
            claim.release()
            return {"trial_id": plan.trial_id, "state": TrialState.COMPLETED.value, "metric": value, "step": state.step}
        except claims.CheckpointCollision as exc:
            if _same_trial(exc, plan):
                # A newer attempt of this same trial took the directory over (we were presumed dead,
                # e.g. our node was set down): stop writing, it is not a collision between trials.
                self._end(Ended(AttemptEnd.LOST, Cause.SUPERSEDED, reason=exc.reason))
                return {"trial_id": plan.trial_id, "state": "superseded"}
            self._end(Ended(AttemptEnd.QUARANTINED, Cause.CHECKPOINT_COLLISION, reason=str(exc)))
            if not self.search.is_quarantined_attempt(plan.trial_id, self.attempt):
                # The first to find the collision quarantines both; the other attempt only stops.
                quarantine.quarantine_collision(self.search, plan.trial_id, self.attempt, exc)
            return {"trial_id": plan.trial_id, "state": TrialState.QUARANTINED.value, "reason": str(exc)}
        except StopAttempt as exc:
            return {"trial_id": plan.trial_id, "state": str(exc)}
        except Diverged as exc:
            self._fail(Cause.DIVERGED, exc)
            raise
        except MemoryError as exc:
            self._fail(Cause.OUT_OF_MEMORY, exc)
            raise
        except Exception as exc:
            self._fail(Cause.EXCEPTION, exc)
            raise

    def _admit(self, contract: Contract) -> None:
        plan = self.plan
        # What the plan says it runs against, compared with what the contract pins (the plan's
        # contract digest is compared as text below: a damaged one is a rejection, not a crash).
        identity = replace(TrialIdentity.for_contract(plan.trial_id, contract, plan.config_hash), image_digest=plan.image_digest)
        outcome = admit(identity, contract)
        if outcome == "admit" and plan.contract_digest != contract.digest:
            outcome = "reject:contract_digest"
        if outcome == "admit":
            split = read_split(plan.split_path)
            observed = WorkerObservation(snapshot_digest(plan.snapshot_path), split.digest, split.method.value, image_digest(plan.image))
            outcome = check_worker(observed, contract)
        if outcome != "admit":
            self._end(Ended(AttemptEnd.REJECTED, outcome=outcome, reason=outcome))
            raise StopAttempt(TrialState.REJECTED.value)

    def _resolve_unended_attempt(self) -> None:
        """The previous attempt never said how it ended (killed with the node, SIGKILL): say it now."""
        last = self.prior.attempts[-1] if self.prior.attempts else None
        if last is None or last.how is not None:
            return
        self.ledger.resolved(last.number, previous_attempt_ending(last, self.facts))
        self.prior = self.search.record(self.plan.trial_id)

    def _claim(self, ckpt_dir: str, identity: TrialIdentity) -> claims.Claim:
        """Claim the directory; if an earlier attempt of this trial still runs (its node was set down
        but its process lives on), wait for it to die rather than train beside it."""
        deadline = time.monotonic() + PREVIOUS_ATTEMPT_WAIT_S
        while True:
            try:
                return claims.claim_directory(ckpt_dir, claims.ClaimIdentity.here(identity, job_id=self.facts.job_id, attempt=self.attempt))
            except claims.CheckpointCollision as exc:
                theirs = exc.their_attempt
                if not _same_trial(exc, self.plan) or theirs is None:
                    raise
                if theirs > self.attempt:
                    self._end(Ended(AttemptEnd.LOST, Cause.SUPERSEDED, reason=exc.reason))
                    raise StopAttempt("superseded") from None
                if time.monotonic() > deadline:
                    self._end(Ended(AttemptEnd.INTERRUPTED, Cause.PREVIOUS_ATTEMPT_ALIVE, reason=exc.reason))
                    raise StopAttempt("previous_attempt_alive") from None
                time.sleep(2.0)

    def _reserve(self, contract: Contract) -> None:
        """Hold this attempt's worst case before using anything; a full budget ends the trial normally."""
        held = reserve_attempt(self.search.path, contract, self.plan.trial_id, self.attempt)
        if not held.ok:
            self._end(Ended(AttemptEnd.BUDGET_EXHAUSTED, outcome="hold:budget", reason=f"hold:budget: {held.message}"))
            raise StopAttempt(TrialState.BUDGET_EXHAUSTED.value)
        self.reserved = True

    def _checkpoint_dir(self) -> str:
        if self.prior.quarantines:
            # A quarantined trial reruns in a directory nobody else can have been pointed at, named
            # by its quarantine generation, so a preempted clean rerun resumes its own checkpoints.
            return str(self.search.path / "checkpoints-clean" / f"{self.plan.trial_id}-q{self.prior.tainted_upto}")
        return self.plan.checkpoint_dir()

    def _load_data(self) -> dict:
        plan = self.plan
        split = read_split(plan.split_path)
        train_part = load_partition(plan.snapshot_path, split, "train")
        val = load_partition(plan.snapshot_path, split, "validation")
        x_train, (x_val,) = featurize(train_part.images, [val.images], plan.preprocessing["revision"], int(plan.preprocessing["pool"]))
        return {"x_train": x_train, "y_train": train_part.labels, "x_val": x_val, "y_val": val.labels}

    def _resume_or_start(self, n_features: int) -> TrainState:
        latest = self.store.load_latest()
        for problem in self.store.problems:
            self.ledger.checkpoint_skipped(self.attempt, str(problem.path), problem.reason)
        if latest is None:
            state = init_state(n_features, hyper_of(self.plan), self.plan.seed)
        else:
            state = TrainState(latest.step, dict(latest.params), dict(latest.optimizer), latest.rng_state)
        self._hold(state)
        return state

    # --- the loop's callbacks -----------------------------------------------------------------
    def _hold(self, state: TrainState) -> None:
        self.current = state

    def _save(self, state: TrainState) -> None:
        self.store.save(state.step, state.params, state.opt, state.rng_state)

    def _validated(self, step: int, value: float, final: bool) -> None:
        self._stop_if_quarantined()
        is_milestone = self.milestones.report(self.plan.trial_id, step, value, self.attempt)
        self.ledger.milestone(self.attempt, step, value, is_milestone)
        if final or not is_milestone:
            return
        decision = self.milestones.decide(self.pruner, self.plan.trial_id, step)
        if decision.action.stops_trial:
            self._end(
                Ended(
                    AttemptEnd.PRUNED,
                    step=step,
                    milestone=step,
                    value=value,
                    reason=f"pruned at milestone {step}: {value:.4f} > threshold {decision.threshold:.4f}",
                )
            )
            raise StopAttempt(TrialState.PRUNED.value)

    def _stop_if_quarantined(self) -> None:
        if self.search.is_quarantined_attempt(self.plan.trial_id, self.attempt):
            self._end(Ended(AttemptEnd.QUARANTINED, Cause.CHECKPOINT_COLLISION, reason="quarantined while running"))
            raise StopAttempt(TrialState.QUARANTINED.value)

    # --- endings ------------------------------------------------------------------------------
    def _end(self, ending: Ended) -> None:
        if not self.ended:
            self.ledger.ended(self.attempt, ending)
            self.ended = True  # only once it is on disk
            if self.reserved:
                settle_attempt(self.search.path, self.contract, self.plan.trial_id, self.attempt, self.started_at)

    def _fail(self, cause: Cause, exc: BaseException) -> None:
        step = self.current.step if self.current is not None else 0
        # A configuration that fails twice with the same class is a result about the design.
        self._end(Ended(AttemptEnd.FAILED, cause, final=cause in self.prior.failures, step=step, message=f"{type(exc).__name__}: {exc}"[:500]))

    def interrupt(self, cause: Cause) -> bool:
        """On the scheduler's signal: checkpoint, record, and say whether to requeue."""
        if self.ended:
            return False  # the attempt already ended (a result, a rejection): nothing to requeue
        state = self.current
        if state is not None and self.store is not None and state.step > 0:
            try:
                self._save(state)
            except claims.CheckpointCollision:
                return False
        self._end(Ended(AttemptEnd.INTERRUPTED, cause, step=state.step if state is not None else 0))
        preempted, other = interruption_counts(self.prior)
        preempted, other = (preempted + 1, other) if cause is Cause.PREEMPTED else (preempted, other + 1)
        limit = self.plan.policy.exceeded(preempted, other)
        if limit:
            self.ledger.gave_up(limit, self.attempt)
            return False
        return True
