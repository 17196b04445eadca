"""One attempt of one trial, start to end, with every transition journaled.

Order matters and is the point of this module:
1. admission against the frozen contract, then the worker's own check of what it actually opened;
2. the checkpoint-directory claim (a collision quarantines both trials before any training);
3. build the researcher's trainer on the loader's arrays; resume it from the last good checkpoint;
4. train (``training.py``); report at milestones only; the stop rule compares same-milestone peers;
5. end: completed with its metric (a K-fold trial's: the mean over its fold runs), pruned, failed with a class, interrupted, quarantined, or
   rejected (also when the trainer asks for the final partition).

The process is fenced from the final partition's files (``parcel_hpc.fence``) once admission has read
the snapshot and before it imports the trainer: every moment trainer code runs (its import, its
``__init__``, every call) is behind the fence, which no code in the process can lift.

A K-fold trial (its split has folds: ``Split.fold_count``) runs its K fold runs in turn inside this
one attempt, steps 2 to 4 once per fold: each fold run claims its own checkpoint directory (the
trial's, ``fold-<k>`` inside it; the claim names the fold), trains a fresh trainer on that fold's
training part with the preprocessing fitted there, is scored on its validation fold, and reports
its milestones to that fold's pruning store. An attempt after an interruption walks the folds
again: a fold whose last checkpoint is at the last step is scored from it (no step runs twice), and
the first unfinished fold resumes from its own checkpoint, bit-exact as a trial without folds. The
attempt, not the fold run, is what the scheduler sees, retries and classifies, and what the budget
reserves (its time limit covers the K fold runs). Left out: fold runs of one trial in parallel slots.

The trainer's state is taken only between steps: the scheduler's signal is held until the loop's next
step boundary (``signals.py``; ``Run.stepped`` reads it), where the loop checkpoints and returns; the
held signal then reaches submitit's handler, whose ``interrupt`` records the interruption.
"""

from __future__ import annotations

import enum
import errno
import os
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import cast

from parcel_hpc import anchor, fence
from parcel_hpc.budget import SearchBudget
from parcel_hpc.checkpoints import claims
from parcel_hpc.checkpoints import store as ckpt
from parcel_hpc.checkpoints.gang import GangCheckpoints
from parcel_hpc.checkpoints.writer import BackgroundWriter
from parcel_hpc.data import Split, read_split
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.admission import TrialIdentity, admit, check_worker, drift_detail
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.metric import FoldScores
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.governance.shape import ShapePlan
from parcel_hpc.ledger import Admitted, AttemptEnd, Cause, DeviceUse, Ended, SearchDir, Started, TrialRecord, TrialState
from parcel_hpc.lifecycle import settlement
from parcel_hpc.lifecycle.actions import interruption_counts, previous_attempt_ending
from parcel_hpc.pruning import MilestoneStore, make_pruner, value_over_folds
from parcel_hpc.trainer import (
    FINAL_PARTITION_OUTCOME,
    Devices,
    DevicesNotGranted,
    Diverged,
    InvalidPredictions,
    Trainer,
    TrainerState,
    TrainingData,
    UnsavableState,
    build_params,
    make_trainer,
    threads,
)
from parcel_hpc.trainer.base import checked_probabilities
from parcel_hpc.trainer.run import Due, Restored, Run, Stop
from parcel_hpc.worker import quarantine
from parcel_hpc.worker.cache import WorkerCache
from parcel_hpc.worker.devices import UtilizationSampler, device_use
from parcel_hpc.worker.gang import FINAL_PARTITION, GangEnv, Leader, LeaderSide, RankFailed, RankHung, RankLost, Watchdog, restored_of
from parcel_hpc.worker.plan import WorkerPlan
from parcel_hpc.worker.result import Ran, WorkerResult
from parcel_hpc.worker.signals import StepBoundarySignals, toolkit_handlers
from parcel_hpc.worker.training import LoopCallbacks, budget, scorer, step_hooks, train

PEERS_AFTER_FAILURE_S = 1.0  # how long a broken gang's rank 0 waits for its peers' GPU readings
PREVIOUS_ATTEMPT_WAIT_S = 90.0  # SLURM's KillWait plus slurmd's cleanup, with margin
TRACEBACK_CHARS = 20_000  # the end of a failure's traceback kept in its journal line (the innermost frames)


def _same_trial(exc: claims.CheckpointCollision, plan: WorkerPlan) -> bool:
    """The holder is another attempt of this very trial's run (of the same fold, for a K-fold trial)."""
    trial = exc.their_trial
    return trial is not None and not exc.other_search and not exc.other_fold and trial.trial_id == plan.trial_id and trial.config_hash == plan.config_hash


class StopReason(enum.Enum):
    """Why an attempt stopped without a result (its ending is journaled already)."""

    REJECTED = "rejected"  # its plan is not of this contract, or its trainer asked for the final partition
    QUEUED = "queued"  # drift, or no fence here: the trial stays queued for a worker where it matches
    BUDGET_EXHAUSTED = "budget_exhausted"  # the budget cannot hold its worst case
    SUPERSEDED = "superseded"  # a newer attempt of the trial took its checkpoint directory over
    PREVIOUS_ATTEMPT_ALIVE = "previous_attempt_alive"  # an earlier attempt's process still holds the directory
    INTERRUPTED = "interrupted"  # saved, and the scheduler's handler ended it (it resumes later)
    QUARANTINED = "quarantined"  # its checkpoint directory collided with another trial's while it ran
    CANCELLED = "cancelled"  # its owner cancelled it while it ran in a pack
    PRUNED = "pruned"  # its milestone value lost to its peers'

    @classmethod
    def of(cls, stop: Stop) -> StopReason:
        """The reason of a training loop that returned on ``stop`` with its ending journaled."""
        return _OF_STOP[stop]

    def stop(self) -> Stop:
        """What the training loop is told when this stop is read at one of its steps."""
        return next(s for s, r in _OF_STOP.items() if r is self)


_OF_STOP = {Stop.PRUNED: StopReason.PRUNED, Stop.CANCELLED: StopReason.CANCELLED, Stop.QUARANTINED: StopReason.QUARANTINED, Stop.REJECTED: StopReason.REJECTED}


class StopAttempt(Exception):
    """Stop this attempt without a result; the reason is already journaled."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class AttemptTimeLimit(Exception):
    """A packed attempt reached its own time limit (the job's limit covers the whole pack)."""


class AttemptRun:
    """``limit_s``: the attempt's own wall-clock limit where the job's is longer (a packed task: the
    scheduler signals only at the end of the pack's); None where the scheduler's limit is the attempt's."""

    def __init__(
        self,
        plan: WorkerPlan,
        facts: Started,
        cache: WorkerCache | None = None,
        limit_s: float | None = None,
        prior: TrialRecord | None = None,
        gang: GangEnv | None = None,
    ) -> None:
        """``prior``: the trial's record, when the caller has just read it. ``gang``: this process is
        rank 0 of a trial of several ranks (the others run ``worker/peer.py``): the attempt is the
        gang's, its claim the gang's one claim, its checkpoints the gang's (``GangCheckpoints``)."""
        self.plan = plan
        self.gang = gang
        self.leader: Leader | None = None  # the gang's channel, once every peer said hello
        self.facts = facts
        self.cache = cache or WorkerCache()
        self.limit_s = limit_s
        self.deadline = float("inf")
        self.search = SearchDir(Path(plan.search_dir))
        record = prior if prior is not None else self.search.record(plan.trial_id)
        self.prior = record
        self.attempt = self.search.claim_attempt(plan.trial_id, 1 + max((a.number for a in record.attempts), default=0))
        self.ledger = self.search.writer(plan.trial_id, f"a{self.attempt}")
        self.store: ckpt.CheckpointStore | GangCheckpoints | None = None
        self.writer: BackgroundWriter | None = None  # the store's saves, written off the training path
        self.claim: claims.Claim | None = None
        self.milestones = MilestoneStore(self.search.path, plan.pruner["milestones"])
        self.fold: int | None = None  # the fold run under way of a K-fold trial (None: a trial without folds)
        self.pruner = make_pruner(plan.pruner)
        self._restored: Restored | None = None  # the checkpoint read before the loop, until the loop restores it
        self.timed_out = False  # the attempt's own limit stopped its loop
        self.step = 0  # steps the trainer has done
        self.data: TrainingData | None = None
        self._asked: list[str] = []  # every fold run's requests for the final partition: one record for the attempt
        self._peers_asked: list[str] = []  # a gang's other ranks' requests, as they reported them
        self.fenced: fence.Armed | None = None  # the fence around this process, once admission armed it
        self.trips_before = len(fence.tripped())  # what earlier trials of the pack tried is theirs
        self.programs_before = len(fence.allowed())  # and the compiler's programs they started
        self.ended = False
        self.began = False  # its started event is on disk
        self.signals = StepBoundarySignals()  # ``pending`` still holds a signal that arrived after the last step
        self.reserved = False
        self.budget: SearchBudget | None = None  # the pack's open journal, once this attempt reserves
        self.started_at = 0.0
        self.contract: Contract | None = None
        self.split: Split | None = None  # read once, by admission
        self.sampler: UtilizationSampler | None = None  # from the build to the end: what it used of its GPUs

    # --- the attempt --------------------------------------------------------------------------
    def execute(self) -> WorkerResult:
        plan = self.plan
        if self.prior.state.is_finished():
            # A late requeue or a duplicate dispatch of a finished trial: it never trains twice.
            return WorkerResult(plan.trial_id, Ran.ALREADY_FINISHED, self.prior.state.value)
        if self.limit_s is not None:
            self.deadline = time.monotonic() + self.limit_s
        self._resolve_unended_attempt()
        self.started_at = self.ledger.started(self.attempt, self.facts).t  # the ledger's start: the budget settles what the ledger shows
        self.began = True
        threads.bind(plan.cpus)  # before admission imports the trainer (and torch with it)
        try:
            contract = self.contract = self.search.contract()
            if self.gang is not None:
                # Every peer says hello before anything is decided: a peer told nothing more (rank 0
                # stopped before training) sees the channel close and exits without training.
                self.leader = Leader.open(self.gang.channel_port, self.gang.world_size, hang_s=plan.rank_wait_s, job=self.gang.job_id)
            self._admit(contract)
            self._reserve(contract)
            # The claim fields only: claims and checkpoint headers store and compare exactly these.
            identity = TrialIdentity(plan.trial_id, plan.config_hash, contract.digest, contract["snapshot_digest"])
            k = cast(Split, self.split).fold_count  # _admit read it
            values = []
            with self.signals as held:
                for fold in range(k):
                    step, value = self._run_fold(contract, identity, held, fold if k > 1 else None)
                    values.append(value)
                    if fold < k - 1:
                        self._saves_written()  # its last save durable before its chain is let go
                        cast(claims.Claim, self.claim).release()  # this fold run is done: its chain is left in order
                        self._interrupt_between_folds(held)
            self._stop_if_final_requested()
            folds = FoldScores(tuple(values)) if k > 1 else None
            metric = folds.mean if folds is not None else value
            self._end(Ended(AttemptEnd.COMPLETED, metric=metric, step=step, folds=folds.values if folds is not None else ()))
            cast(claims.Claim, self.claim).release()
            return WorkerResult(plan.trial_id, Ran.COMPLETED, metric=metric, step=step)
        except claims.CheckpointCollision as exc:
            return self._collided(exc)
        except StopAttempt as exc:
            self._saves_abandoned(exc)  # its ending is on disk; a save still in flight finishes first
            return WorkerResult(plan.trial_id, Ran.STOPPED, exc.reason.value)
        except AttemptTimeLimit:
            try:
                again = self.interrupt(Cause.TIMEOUT)
            except Exception as exc:  # saving at the limit failed (a full disk, the trainer's state())
                return self._unexpected(exc)
            return WorkerResult(plan.trial_id, Ran.INTERRUPTED, cause=Cause.TIMEOUT, again=again)
        except (RankLost, RankHung) as exc:
            return self._gang_broke(exc)
        except Exception as exc:
            return self._unexpected(exc)
        finally:
            if self.leader is not None:
                self.leader.close()  # a peer still waiting on rank 0 sees it gone and exits

    def _run_fold(self, contract: Contract, identity: TrialIdentity, held: StepBoundarySignals, fold: int | None) -> tuple[int, float]:
        """One fold run of a K-fold trial (``fold`` None: the one run of a trial without folds): claim
        its checkpoint chain, build a fresh trainer on its data, resume it, train or score its last
        checkpoint; its (step, validation value)."""
        plan = self.plan
        self.fold, self.step = fold, 0
        ckpt_dir = self._checkpoint_dir(fold)
        claim = self.claim = self._claim(ckpt_dir, identity)
        if self.gang is not None and self.leader is not None:
            self.store = GangCheckpoints(
                ckpt_dir,
                identity,
                rank=0,
                world_size=self.gang.world_size,
                attempt=self.attempt,
                keep_last=plan.keep_last,
                claim=claim,
                commit_wait_s=plan.rank_wait_s,
            )
            # The peers train now, in this attempt's checkpoint directory, under its one claim.
            told = {"train": True, "trial_id": plan.trial_id, "attempt": self.attempt, "ckpt_dir": ckpt_dir, "claim": claim.record.to_json()}
            self.leader.send(told)
        else:
            self.store = ckpt.CheckpointStore(ckpt_dir, identity, keep_last=plan.keep_last, claim=claim)
        self.writer = BackgroundWriter(self.store)
        # Admission read the snapshot and the split before the fence: neither is read twice.
        data = self.cache.training_data(plan.snapshot_path, cast(Split, self.split), plan.preprocessing, fold or 0)
        data = self.data = replace(
            data,
            devices=Devices.from_env(self.facts.gpus, self.facts.cuda_visible_devices),
            world_size=self.gang.world_size if self.gang is not None else 1,
            _asked_for_final=self._asked,
        )
        if self.sampler is None:
            self.sampler = UtilizationSampler(data.devices.visible).start()  # after the fence: its thread is inside it
        trainer = make_trainer(contract["trainer"], self.search.path)  # the trainer's __init__
        data = self.data = replace(data, budget=budget(plan, type(trainer).unit))  # its steps, milestones, cadence
        trainer.build(build_params(trainer, plan.params), plan.seed, data)
        restored = self._restored = self._latest()
        self._stop_if_final_requested()
        if restored is not None:
            self.step = restored.step
            # Under a declared train.resume_tolerance the launch admitted a resume that may drift: its metric says so.
            self.ledger.resumed(self.attempt, restored.step, exact=not contract["train"].get("resume_tolerance"), fold=fold)
        if restored is not None and restored.step >= plan.steps:
            return self._score_last(trainer, restored, data)
        return self._train(trainer, data, held)

    def _interrupt_between_folds(self, held: StepBoundarySignals) -> None:
        """A signal that came during the last step of a fold run: honoured here, before the next fold
        starts (the next attempt scores the finished fold from its last checkpoint)."""
        if held.pending:
            held.deliver()
            if self.ended:
                raise StopAttempt(StopReason.INTERRUPTED)

    def _collided(self, exc: claims.CheckpointCollision) -> WorkerResult:
        plan = self.plan
        self._saves_abandoned(exc)
        if _same_trial(exc, plan):
            # A newer attempt of this same trial took the directory over (we were presumed dead,
            # e.g. our node was set down): stop writing, it is not a collision between trials.
            self._end(Ended(AttemptEnd.LOST, Cause.SUPERSEDED, reason=exc.reason))
            return WorkerResult(plan.trial_id, Ran.SUPERSEDED)
        self._end(Ended(AttemptEnd.QUARANTINED, Cause.CHECKPOINT_COLLISION, reason=str(exc)))
        if not self.search.is_quarantined_attempt(plan.trial_id, self.attempt):
            # The first to find the collision quarantines both; the other attempt only stops.
            quarantine.quarantine_collision(self.search, plan.trial_id, self.attempt, exc)
        return WorkerResult(plan.trial_id, Ran.QUARANTINED, str(exc))

    def _unexpected(self, exc: Exception) -> WorkerResult:
        """How an exception out of the trainer or the loop ends the attempt; re-raised when it is a failure."""
        plan = self.plan
        if self.leader is not None and (said := self.leader.cause_of(exc, self.step)) is not exc:
            if isinstance(said, RankLost):
                return self._gang_broke(said)
            said.__cause__ = exc
            exc = said
        self._saves_abandoned(exc)
        if isinstance(exc, RankFailed) and exc.cause == FINAL_PARTITION:
            self._peers_asked.append(f"on rank {exc.rank}: {exc.traceback}")  # its words, as that rank's fence put them
        if self._final_requests():
            # Refused or fenced and not caught (or caught, then failing): the request is the result.
            self._reject_final()
            return WorkerResult(plan.trial_id, Ran.REJECTED, str(FINAL_PARTITION_OUTCOME))
        if _no_space(exc):
            # A full filesystem is the cluster's problem, not the configuration's: an interruption,
            # retried within budget.max_retries, never a failure class of the design.
            self._end(Ended(AttemptEnd.INTERRUPTED, Cause.NO_SPACE, step=self.step, message=" ".join(str(exc).split())[:500]))
            return WorkerResult(plan.trial_id, Ran.INTERRUPTED, cause=Cause.NO_SPACE)
        self._fail(failure_class(exc), exc)
        raise exc

    def _gang_broke(self, exc: RankLost | RankHung) -> WorkerResult:
        """A rank left the gang (its process or node gone, or it never came): an interruption, the gang
        requeued whole from its last complete checkpoint. A rank that hung at a step while the others
        waited: the trial's failure, its hung process on this host ended by its pid (on other hosts
        the scheduler ends the job's other tasks when rank 0 exits with an error)."""
        if isinstance(exc, RankLost) and self.leader is not None and isinstance(said := self.leader.cause_of(exc, self.step), RankFailed):
            said.__cause__ = exc
            return self._unexpected(said)
        self._saves_abandoned(exc)
        if isinstance(exc, RankHung) and exc.step > 0:
            self._end_hung(exc)
            self._fail(Cause.RANK_HUNG, exc)
            raise exc
        again = self.interrupt(Cause.RANK_LOST)
        return WorkerResult(self.plan.trial_id, Ran.INTERRUPTED, str(exc), cause=Cause.RANK_LOST, again=again)

    def _admit(self, contract: Contract) -> None:
        plan = self.plan
        # What the plan says it runs against, compared with what the contract pins (the plan's
        # contract digest is compared as text below: a damaged one is a rejection, not a crash).
        identity = replace(TrialIdentity.for_contract(plan.trial_id, contract, plan.config_hash), image_digest=plan.image_digest)
        outcome = admit(identity, contract)
        if outcome.is_admit and plan.contract_digest != contract.digest:
            outcome = Outcome.reject("contract_digest")
        ranks = self.gang.world_size if self.gang is not None else 1
        if outcome.is_admit and not ShapePlan.of(contract["resources"]).admits(self.prior.spec.resources, self.prior.spec.params, ranks):
            outcome = Outcome.reject("resources")
        if not outcome.is_admit:
            # The plan itself is not of this contract: no environment makes it one.
            self._end(Ended(AttemptEnd.REJECTED, outcome=outcome, reason=str(outcome)))
            raise StopAttempt(StopReason.REJECTED)
        split = self.split = read_split(plan.split_path)
        try:
            for fold in range(split.fold_count):  # the snapshot is read before the fence or never: every fold's part
                self.cache.training_data(plan.snapshot_path, split, plan.preprocessing, fold)
        except PermissionError:
            if not fence.is_armed():
                raise
            # A later trial of a pack: the snapshot changed since this process read it, and it is fenced from it now.
            reason = f"{plan.snapshot_path} changed since this worker read it, and the worker is fenced from it now; a fresh worker reads it"
            self._end(Ended(AttemptEnd.REJECTED, Cause.DRIFT, outcome=Outcome.reject("snapshot_digest"), reason=reason))
            raise StopAttempt(StopReason.QUEUED) from None
        observed, problem = self.cache.observe(plan.snapshot_path, split, plan.image, contract["trainer"], self.search.path, self._fence)
        self._stop_if_final_requested()  # what the trainer's module did at its import
        outcome = check_worker(observed, contract)
        if not outcome.is_admit:
            # Drift: what this worker opened is not what the contract pins. Nothing ran, so the trial
            # stays queued for a worker whose environment matches again (the launch stops on it).
            reason = f"{outcome}: {problem if problem and outcome == Outcome.reject('trainer') else drift_detail(outcome, observed, contract)}"
            self._end(Ended(AttemptEnd.REJECTED, Cause.DRIFT, outcome=outcome, reason=reason))
            raise StopAttempt(StopReason.QUEUED)
        layer = self.fenced.layer if self.fenced is not None else None
        self.ledger.admitted(
            self.attempt, Admitted(observed.snapshot_digest, observed.split_digest, observed.image_digest, observed.trainer["source_digest"], layer)
        )

    def _fence(self) -> None:
        """Fence this process from the final partition's files before any trainer code runs (once per
        process: a pack's next trials find it fenced). One that cannot be fenced runs no trainer code:
        the trial stays queued for a worker where it can, and the launch stops on it, as on drift."""
        try:
            self.fenced = fence.arm(fence.Protected.of(self.plan.split_path, self.plan.snapshot_path))
        except fence.Unfenceable as exc:
            self._end(Ended(AttemptEnd.REJECTED, Cause.DRIFT, outcome=exc.outcome, reason=f"{exc.outcome}: {exc.detail}"))
            raise StopAttempt(StopReason.QUEUED) from None
        toolkit_handlers()  # the scheduler's handler (submitit's requeue) starts scontrol: the toolkit's program, not the trainer's

    def _resolve_unended_attempt(self) -> None:
        """The previous attempt never said how it ended (killed with the node, SIGKILL): say it now."""
        last = self.prior.attempts[-1] if self.prior.attempts else None
        if last is None or last.how is not None:
            return
        self.ledger.resolved(last.number, previous_attempt_ending(last, self.facts))
        self.prior = self.search.record(self.plan.trial_id)
        settlement.settle_ended(self.search, [self.prior])  # its hold, with the hours the ledger saw it run

    def _claim(self, ckpt_dir: str, identity: TrialIdentity) -> claims.Claim:
        """Claim the directory; if an earlier attempt of this trial still runs (its node was set down
        but its process lives on), wait for it to die rather than train beside it."""
        deadline = time.monotonic() + PREVIOUS_ATTEMPT_WAIT_S
        while True:
            try:
                found = self.search.identity()  # claims name their search: another search's directory is never taken over or moved
                here = claims.ClaimIdentity.here(
                    identity, job_id=self.facts.job_id, attempt=self.attempt, search_id=found.search_id if found else "", fold=self.fold
                )
                return claims.claim_directory(ckpt_dir, here)
            except claims.CheckpointCollision as exc:
                theirs = exc.their_attempt
                if not _same_trial(exc, self.plan) or theirs is None:
                    raise
                if theirs > self.attempt:
                    self._end(Ended(AttemptEnd.LOST, Cause.SUPERSEDED, reason=exc.reason))
                    raise StopAttempt(StopReason.SUPERSEDED) from None
                if time.monotonic() > deadline:
                    self._end(Ended(AttemptEnd.INTERRUPTED, Cause.PREVIOUS_ATTEMPT_ALIVE, reason=exc.reason))
                    raise StopAttempt(StopReason.PREVIOUS_ATTEMPT_ALIVE) from None
                time.sleep(2.0)

    def _reserve(self, contract: Contract) -> None:
        """Hold this attempt's worst case before using anything; a full budget ends the trial normally."""
        self.budget = self.cache.budget(self.search.path, contract)
        held = self.budget.reserve(self.plan.trial_id, self.attempt, self.prior.spec.resources)
        if not held.ok:
            self._end(Ended(AttemptEnd.BUDGET_EXHAUSTED, outcome=Outcome.HOLD_BUDGET, reason=f"{Outcome.HOLD_BUDGET}: {held.message}"))
            raise StopAttempt(StopReason.BUDGET_EXHAUSTED)
        self.reserved = True

    def _checkpoint_dir(self, fold: int | None) -> str:
        """The trial's directory; a K-fold trial's fold run's, ``fold-<k>`` inside it (each its own chain)."""
        if self.prior.quarantines:
            # A quarantined trial reruns in a directory nobody else can have been pointed at, named
            # by its quarantine generation, so a preempted clean rerun resumes its own checkpoints.
            trial_dir = str(self.search.path / "checkpoints-clean" / f"{self.plan.trial_id}-q{self.prior.tainted_upto}")
        else:
            trial_dir = self.plan.checkpoint_dir()
        return trial_dir if fold is None else str(Path(trial_dir) / f"fold-{fold}")

    def _latest(self) -> Restored | None:
        """The trial's last good checkpoint (None: a fresh start); the files it skipped are journaled."""
        assert self.store is not None  # execute() made it before building the trainer
        self._saves_written()  # a loop restarted after a requeue reads the save it just made
        if isinstance(self.store, GangCheckpoints):
            found = self.store.load_latest()  # the newest step every rank's part is committed for
            return None if found is None else restored_of(found, self.store)
        latest = self.store.load_latest()
        for problem in self.store.problems:
            self.ledger.checkpoint_skipped(self.attempt, anchor.shown(problem.path), problem.reason)
        return None if latest is None else Restored(latest.step, TrainerState(latest.params, latest.extra or {}))

    def _train(self, trainer: Trainer, data: TrainingData, held: StepBoundarySignals) -> tuple[int, float]:
        """The trainer's loop to the last step; a stop the loop obeyed ends the attempt here."""
        calls = LoopCallbacks(self._restore, self._stepped, self._save, self._validated)
        watch = None
        if self.leader is not None:
            watch = Watchdog.of_gang(self.plan.rank_wait_s, self._stalled)
            side = LeaderSide(self.leader, watch)
            calls = replace(calls, agreed=self._agreed_by_gang(side), agreed_after_validation=side.after_validation)
        try:
            return self._train_loop(trainer, data, held, calls, watch)
        finally:
            if watch is not None:
                watch.stop()

    def _train_loop(self, trainer: Trainer, data: TrainingData, held: StepBoundarySignals, calls: LoopCallbacks, watch: Watchdog | None) -> tuple[int, float]:
        while True:
            run = train(self.plan, trainer, data, calls, step_hooks())
            if watch is not None:
                watch.pause()  # the loop returned: what follows (the last commit, the requeue) is the toolkit's, not a step
            if run.stop is not Stop.REQUEUE or run.done:
                break  # a requeue read at the last step came with its result: the trial is complete
            self._saves_written()  # the signal's save is durable before the attempt says it was interrupted
            if self.timed_out:
                raise AttemptTimeLimit()  # the loop saved its whole state at the step it stopped at
            held.deliver()  # submitit's checkpoint: it records the interruption, requeues and ends the process
            if self.ended:
                raise StopAttempt(StopReason.INTERRUPTED)
            # The handler let the attempt go on (no scheduler behind it): resume from the checkpoint just saved.
        self._saves_written()  # the last step's save is durable before the attempt ends
        if run.stop is not None and not (run.stop is Stop.REQUEUE and run.done):
            raise StopAttempt(StopReason.of(run.stop))  # its ending is on disk already
        return run.step, run.value

    def _score_last(self, trainer: Trainer, restored: Restored, data: TrainingData) -> tuple[int, float]:
        """Resumed from the final checkpoint: the state it holds, scored (no step is left to run)."""
        trainer.load_state(restored.state)
        scores = checked_probabilities(trainer.predict("validation"), len(data.validation), "validation", restored.step)
        value = scorer(self.plan, data)(scores)
        if (stop := self._validated(restored.step, value, True, {})) is not None:
            raise StopAttempt(StopReason.of(stop))
        return restored.step, value

    # --- the loop's callbacks -----------------------------------------------------------------
    def _restore(self) -> Restored | None:
        restored, self._restored = self._restored, None
        return restored if restored is not None else self._latest()  # read again only when the loop restarts

    def _stepped(self, step: int) -> Stop | None:
        self.step = step
        if self._final_requests():
            self._reject_final()
            return Stop.REJECTED
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return Stop.REQUEUE  # at a step boundary: the loop saves a whole state, then returns
        return Stop.REQUEUE if self.signals.pending else None  # the scheduler's signal, held to this boundary

    def _stalled(self, waited: float) -> None:
        """The watchdog's thread: rank 0 reached no step boundary within the bound, its main thread stuck
        (in a collective a peer never joined, most often). The attempt's ending is written from here (the
        main thread holds nothing of the ledger while it runs trainer code), then a hung peer on this
        host is ended by its pid (not before: its end wakes the main thread from the collective, which
        would record a lost rank), and this process exits, so the scheduler ends the job's other tasks."""
        try:
            assert self.leader is not None  # a gang's watchdog
            exc = self.leader.stalled(self.step + 1, waited)
            self._fail(failure_class(exc) if isinstance(exc, RankFailed) else Cause.RANK_HUNG, exc)
            if isinstance(exc, RankHung):
                self._end_hung(exc)
        finally:
            os._exit(1)  # whatever happened here: a process left waiting in a collective holds the job

    def _end_hung(self, exc: RankHung) -> None:
        """The hung peers on this host, ended by their pids (this job's own tasks); on other hosts the
        scheduler ends the job's other tasks once rank 0 exits with an error."""
        for rank in exc.ranks:
            host, pid = self.leader.where.get(rank, ("", 0)) if self.leader is not None else ("", 0)
            if pid > 0 and host == self.facts.host:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _agreed_by_gang(self, side: LeaderSide) -> Callable[[Run, int, Due, Stop | None], tuple[Due, Stop | None]]:
        """Rank 0's decision for the gang after each step. A requeue that only a peer's signal asked for
        is this attempt's signal too: held here as if it had reached rank 0, so the loop's return hands
        it to the scheduler's handler (the interruption recorded, the job requeued with every rank)."""

        def agreed(run: Run, step: int, due: Due, stop: Stop | None) -> tuple[Due, Stop | None]:
            due, agreed_stop = side.after_step(run, step, due, stop)
            if agreed_stop is Stop.REQUEUE and not self.signals.pending and not self.timed_out:
                self.signals.pending.append(signal.SIGUSR2)
            return due, agreed_stop

        return agreed

    def _save(self, step: int, state: TrainerState) -> None:
        assert self.writer is not None  # made before the trainer was built
        try:
            # Arrays go to the checkpoint's params section, scalars (JSON) to its extra; copied now,
            # written while the loop goes on (the previous save's error, if any, is raised here).
            self.writer.submit(step, state.arrays, {}, {}, extra=state.scalars, clock=time.monotonic)
        except UsageError as exc:  # a name or value the checkpoint format refuses
            raise UnsavableState(str(exc)) from None

    def _saves_written(self) -> None:
        """Wait until no save is in flight; the writer's error is raised as the attempt's."""
        if self.writer is not None:
            try:
                self.writer.wait()
            except UsageError as exc:
                raise UnsavableState(str(exc)) from None

    def _saves_abandoned(self, failure: BaseException) -> None:
        """An attempt ending on another error: its save in flight finishes first (never two writers
        in the directory), and an error of the writer's rides on ``failure`` as a note."""
        try:
            self._saves_written()
        except Exception as exc:
            failure.add_note(f"the checkpoint being written then failed too: {type(exc).__name__}: {exc}")

    def _validated(self, step: int, value: float, final: bool, train_metrics: Mapping[str, float]) -> Stop | None:
        try:
            self._stop_if_quarantined()
            self._stop_if_cancelled()
        except StopAttempt as exc:
            return exc.reason.stop()  # ended and journaled: the loop returns
        self.ledger.milestone(self.attempt, step, value, step in self.milestones.milestones, train_metrics, fold=self.fold)
        if self.fold:
            # A K-fold trial is compared on its mean over folds 0..fold at this step, with the peers of this fold run.
            before = self.milestones.of_fold(self.fold - 1).report_of(self.plan.trial_id, step)
            compared = value_over_folds(before.value if before is not None else None, self.fold, value)
            if compared is None:
                return None  # its earlier fold's report was withdrawn: not compared on folds its peers have
            value = compared
        store = self.milestones.of_fold(self.fold)
        is_milestone = store.report(self.plan.trial_id, step, value, self.attempt)
        if final or not is_milestone:
            return None
        decision = store.decide(self.pruner, self.plan.trial_id, step)
        if decision.action.stops_trial:
            over = f" (the mean over folds 0..{self.fold})" if self.fold else ""
            where = f"milestone {step}" if self.fold is None else f"milestone {step} of fold {self.fold}{over}"
            self._end(
                Ended(
                    AttemptEnd.PRUNED,
                    step=step,
                    milestone=step,
                    value=value,
                    reason=f"pruned at {where}: {value:.4f} > threshold {decision.threshold:.4f}",
                )
            )
            return Stop.PRUNED
        return None

    def _final_requests(self) -> list[str]:
        """What this attempt's trainer did towards the protected data, in words ([] when nothing)."""
        return fence.reaches(self.data.asked_for_final if self.data is not None else (), since=self.trips_before) + self._peers_asked

    def _stop_if_final_requested(self) -> None:
        """A trainer that asked for the final partition is rejected, even if it caught the refusal."""
        if self._final_requests():
            self._reject_final()
            raise StopAttempt(StopReason.REJECTED)

    def _reject_final(self) -> None:
        asked = "; ".join(self._final_requests())
        self._end(Ended(AttemptEnd.REJECTED, outcome=FINAL_PARTITION_OUTCOME, step=self.step, reason=f"{FINAL_PARTITION_OUTCOME}: {asked}"))

    def _stop_if_quarantined(self) -> None:
        if self.search.is_quarantined_attempt(self.plan.trial_id, self.attempt):
            self._end(Ended(AttemptEnd.QUARANTINED, Cause.CHECKPOINT_COLLISION, reason="quarantined while running"))
            raise StopAttempt(StopReason.QUARANTINED)

    def _stop_if_cancelled(self) -> None:
        """A trial of a pack is cancelled without its job (which runs other trials): it stops itself."""
        if self.limit_s is not None and self.search.record(self.plan.trial_id).state is TrialState.CANCELLED:
            self._end(Ended(AttemptEnd.INTERRUPTED, Cause.CANCELLED_BY_OWNER, step=self.step, reason="cancelled while it ran in a pack"))
            raise StopAttempt(StopReason.CANCELLED)

    def release_claim(self) -> None:
        """Leave the checkpoint directory in order. A packed task calls it after every attempt: its
        process lives on, so the next attempt of the same trial must find the claim released."""
        if self.claim is not None:
            self.claim.release()

    # --- endings ------------------------------------------------------------------------------
    def _end(self, ending: Ended) -> None:
        if not self.ended:
            # A gang's peers tell their readings as their runs end: at the gang's agreed end at once; after
            # a failure or a lost rank some never will, so what has come by then is what is recorded.
            broke = ending.how is AttemptEnd.FAILED or ending.cause is Cause.RANK_LOST
            self._record_device_use(PEERS_AFTER_FAILURE_S if broke else self.plan.rank_wait_s)
            ending = replace(ending, programs=fence.counted(fence.allowed()[self.programs_before :]))
            ended_at = self.ledger.ended(self.attempt, ending).t
            self.ended = True  # only once it is on disk
            if self.reserved:
                assert self.budget is not None  # _reserve set it before reserving
                self.budget.settle(self.plan.trial_id, self.attempt, self.prior.spec.resources, self.started_at, ended_at, gpus=self.facts.gpus)

    def _record_device_use(self, peers_wait_s: float) -> None:
        """Once, just before the ending, for an attempt that got as far as its trainer's build; a gang's
        with every rank's reading (``DeviceUse.of_gang``), the peers' waited for up to ``peers_wait_s``."""
        if self.sampler is not None and self.data is not None:
            self.sampler.stop()
            granted = self.data.devices.count
            try:
                use = device_use(granted, self.sampler)
            except Exception:  # the CUDA error that ended the attempt can fail the reading too: the ending matters more
                use = DeviceUse(("unknown",) * max(1, granted))
            if self.leader is not None:
                use = DeviceUse.of_gang([use, *self.leader.uses(peers_wait_s)], granted)
            self.ledger.device_use(self.attempt, use)
            self.sampler = None

    def _fail(self, cause: Cause, exc: BaseException) -> None:
        # A configuration that fails twice with the same class is a result about the design.
        self._end(
            Ended(
                AttemptEnd.FAILED,
                cause,
                final=cause in self.prior.failures,
                step=self.step,
                message=f"{type(exc).__name__}: {exc}"[:500],
                error_type=type(exc).__name__,
                # A peer's failure: its own traceback, as it reported it.
                traceback=(exc.traceback if isinstance(exc, RankFailed) else "".join(traceback.format_exception(exc)))[-TRACEBACK_CHARS:],
            )
        )

    def interrupt(self, cause: Cause) -> bool:
        """On the scheduler's signal: checkpoint, record, and say whether to requeue."""
        self._saves_written()  # the step boundary's save, durable before the interruption is recorded
        if self.ended or not self.began:
            return False  # it already ended (a result, a rejection), or never started: nothing of it to requeue
        # Its state was saved by its loop, at the step boundary where the signal was read (``_stepped``).
        self._end(Ended(AttemptEnd.INTERRUPTED, cause, step=self.step))
        preempted, other = interruption_counts(self.prior)
        preempted, other = (preempted + 1, other) if cause is Cause.PREEMPTED else (preempted, other + 1)
        limit = self.plan.policy.exceeded(preempted, other)
        if limit:
            self.ledger.gave_up(limit, self.attempt)
            return False
        return True


def _no_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it was raised from) is a full disk or quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def failure_class(exc: BaseException) -> Cause:
    """The failure class of an exception out of the trainer or the loop."""
    if isinstance(exc, RankFailed):
        cause = next((c for c in Cause if c.value == exc.cause), Cause.EXCEPTION)  # as the rank that raised it classified it
        return cause if cause.is_training_failure() else Cause.EXCEPTION
    if isinstance(exc, Diverged):
        return Cause.DIVERGED
    if isinstance(exc, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(exc).__mro__):  # torch.cuda's, without importing torch
        return Cause.OUT_OF_MEMORY
    if isinstance(exc, DevicesNotGranted):
        return Cause.DEVICES_NOT_GRANTED
    if isinstance(exc, UnsavableState):
        return Cause.UNSAVABLE_STATE
    if isinstance(exc, InvalidPredictions):
        return Cause.INVALID_PREDICTIONS
    return Cause.EXCEPTION
