"""The task submitit runs: one job, one or more trials in turn (a pack), one attempt each.

Packing pays process start-up, imports and snapshot loading once for several short trials; each
trial keeps everything governance sees: its own admission, claim, checkpoint directory, ledger
events, budget reservation, and its own time limit (the job's limit is the pack's sum, so a packed
attempt stops itself at its own limit, checkpoints, and waits for its turn again at the end of the
pack). A trial that fails does not stop the pack: its failure is journaled and the next trial runs,
unless the pack's first ``budget.systematic_failures`` attempts all failed alike (``lifecycle.systematic``)
or its environment drifted from the contract: then the trials left stay queued. A search held for good
(``held.json``) starts no trial at all.

submitit calls ``checkpoint`` on the job's signal (preemption or time limit): the running attempt
saves its last consistent state, and the job is requeued with the same trials while any of them is
unfinished; on the requeued run the finished ones are skipped, the interrupted one resumes from its
checkpoint, and those that had not started start: none is lost or run twice.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import UncompletedJobError

from parcel_hpc import anchor
from parcel_hpc.fsio import owner_only_writes
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import SearchDir, TrialRecord
from parcel_hpc.ledger.events import FailureSignature
from parcel_hpc.lifecycle import systematic
from parcel_hpc.worker.attempt import AttemptRun
from parcel_hpc.worker.cache import WorkerCache
from parcel_hpc.worker.jobenv import enter_gang, facts_from_env, signal_cause
from parcel_hpc.worker.peer import PeerAttempt
from parcel_hpc.worker.plan import WorkerPlan
from parcel_hpc.worker.result import Ran, WorkerResult


class TrialTask:
    slot = ""  # handed its trials: no slot

    def __init__(self, plans: Sequence[WorkerPlan], own_limits: bool | None = None) -> None:
        if not plans:
            raise ValueError("a TrialTask needs at least one plan")
        self.plans = tuple(plans)
        # Whether each attempt stops itself at its own limit: where the job's limit is longer than
        # this task needs (a pack; a single trial in an array of packs). Otherwise the scheduler warns.
        self.own_limits = len(self.plans) > 1 if own_limits is None else own_limits
        self._run: AttemptRun | None = None
        self._requeued = False  # the scheduler's signal asked for a requeue: this run starts no further trial

    @property
    def shape(self) -> TrialShape:
        """Its job's: its trials' (a pack's are of one shape: a search with a gang among its shapes packs none)."""
        return self.plans[0].shape

    @property
    def packed(self) -> bool:
        return len(self.plans) > 1

    def job_minutes(self, time_limit_min: int) -> int:
        """Its job's time limit: every trial in it may use its own limit."""
        return len(self.plans) * int(time_limit_min)

    def __getstate__(self) -> dict:
        return {"plans": self.plans, "own_limits": self.own_limits}  # runtime state lives in checkpoints and the ledger

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["plans"], state.get("own_limits"))  # type: ignore[misc]  # unpickling runs the constructor on the new instance

    def __call__(self) -> WorkerResult | list[WorkerResult]:
        owner_only_writes()
        for search_dir in sorted({p.search_dir for p in self.plans}):
            anchor.enter(search_dir)  # held by the job's gate already; a task run by hand holds its own now
        gang = enter_gang(self.plans[0].gpus)
        if gang is not None:
            if self.packed:
                raise RuntimeError("a trial of several ranks is a job of its own; the launch never packs one")
            if gang.rank > 0:
                return PeerAttempt(self.plans[0], gang).execute()  # rank 0 records the trial; this rank trains its share
        facts = facts_from_env(gang=gang)  # a gang's trainer is granted what its rank sees
        cache = WorkerCache()
        results = []
        ran: list[FailureSignature | None] = []  # the failure (None: none) of each attempt this pack ran
        turn = list(self.plans)
        while turn and not self._requeued:
            # (After a requeue was asked, the scheduler ends this run within seconds: a trial started
            # then would die without saying how, and its requeued run would leave it to run alone.)
            plan = turn.pop(0)
            try:
                search = SearchDir(Path(plan.search_dir))
                if (held := search.hold()) is not None:
                    # Held after this job was queued (its first trials failed alike): start nothing more.
                    results.append(WorkerResult(plan.trial_id, Ran.SKIPPED, str(held["outcome"])))
                    continue
                record = search.record(plan.trial_id) if self.packed else None
                if record is not None and (why := _not_here(record, facts.job_id)):
                    results.append(WorkerResult(plan.trial_id, Ran.SKIPPED, why))
                    continue
                limit_s = 60.0 * plan.time_limit_min if self.own_limits else None
                self._run = AttemptRun(plan, facts, cache, limit_s=limit_s, prior=record, gang=gang)
                result = self._run.execute()
            except UncompletedJobError:
                raise  # submitit ends the job (it would not requeue): never swallowed as one trial's failure
            except Exception as exc:
                if not self.packed:
                    raise  # the job's own state says FAILED, as without packing
                result = WorkerResult(plan.trial_id, Ran.FAILED, f"{type(exc).__name__}: {exc}"[:500])
            finally:
                pending = self._run.signals.pending[:1] if self._run is not None else []
                if self._run is not None:
                    self._run.release_claim()
                self._run = None
            results.append(result)
            if self.packed and (why := stops_turn(search, plan.trial_id, ran)):
                # The trials left stay queued, never run against what stopped it (``stops_turn``).
                results += [WorkerResult(p.trial_id, Ran.SKIPPED, why) for p in turn]
                turn = []
            if result.again and gang is not None:
                # A rank left the gang: its interruption is recorded; the whole job is requeued, every rank
                # restarted together (submitit's requeue, as at the scheduler's signal: ``checkpoint``).
                signal.raise_signal(signal.SIGUSR2)
            elif result.again:
                turn.append(plan)  # stopped at its own limit within its retries: resumes after the others
            if pending and self.packed:
                # The job's warning came after that trial's last step, its ending now on disk: the
                # pack checkpoints and requeues for the trials it has left (``checkpoint``).
                signal.raise_signal(pending[0])
        return results if self.packed else results[0]

    def checkpoint(self, *_args: Any, **_kwargs: Any) -> submitit.helpers.DelayedSubmission | None:
        """submitit's hook on SIGUSR2: save, record the interruption, requeue while a trial needs it."""
        run = self._run
        if run is None and not self.packed:
            # Signalled before the attempt began, or a gang's rank lost (the attempt recorded it): requeued whole.
            return submitit.helpers.DelayedSubmission(TrialTask(self.plans, self.own_limits))
        again = run is not None and run.interrupt(signal_cause(run.facts))
        if run is not None:
            run.release_claim()  # an orderly exit: the requeued job's attempt re-enters the directory
        if again if not self.packed else self._unfinished():  # read after the running trial recorded its interruption
            self._requeued = True
            return submitit.helpers.DelayedSubmission(TrialTask(self.plans, self.own_limits))
        return None  # submitit then ends the job without requeue

    def _unfinished(self) -> bool:
        search = SearchDir(Path(self.plans[0].search_dir))
        return any(not search.record(p.trial_id).state.is_finished() for p in self.plans)


def stops_turn(search: SearchDir, trial_id: str, ran: list[FailureSignature | None]) -> str:
    """Note how the attempt just run ended; why the job (a pack, a slot) runs no more trials ("" to
    go on): this environment differs from the contract (every trial would be rejected the same), or
    its first attempts all failed alike (the follower checks, each alone, whether they reproduce)."""
    record = search.record(trial_id)
    if record.awaiting_environment():
        return f"this worker's environment differs from the contract ({record.detail})"
    ran.append(record.attempts[-1].signature() if record.attempts else None)
    if systematic.first_alike(ran, systematic.threshold(search.contract()["budget"])):
        return "the job's first trials failed alike"
    return ""


def _not_here(record: TrialRecord, job_id: str) -> str:
    """Why a (requeued) pack must leave this trial alone ("" to run it): finished, dispatched to
    another job since, or to be dispatched alone (its last attempt ended without saying how)."""
    if record.state.is_finished():
        return "finished"
    if record.jobs and job_id and record.jobs[-1] != job_id:
        return f"dispatched since as job {record.jobs[-1]}"
    if record.skipped_in_turn():
        return "its last attempt ended without saying how: it runs alone"
    return ""
