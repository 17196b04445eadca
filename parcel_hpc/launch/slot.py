"""A slot: one job that runs trials one after another, taking each when it is free
(``hydra.launcher.dispatch=slots``).

A packed job (``task.py``) is handed its trials when it is submitted; a slot takes its next trial
from the search itself, so a sampler that learns is packed too (the slot asks it, told every
result known at that moment) and trials of unequal length balance over the slots:

1. a requeued slot first resumes the trial it was running (its job id is that trial's last);
2. then it takes a queued dispatch (``SearchDir.queued``: trials a launcher admitted and claimed),
   the longest expected that fits its remaining time (``scheduler.slots.choose``), by creating
   ``dispatch-<n>.taken`` exclusively; two slots never take one dispatch;
3. with nothing queued it makes the next proposal of a sampler that learns
   (``propose.proposals.Proposer``, create-exclusive and replayable as a launcher's), admits it,
   writes its plan from the launch's template and claims its first dispatch;
4. it ends when nothing is left that it can run: no allocation idles waiting for work.

Every trial keeps what governance sees (admission, claim, checkpoints, journal, budget): each runs
as one ``AttemptRun`` with its own time limit, its ``submitted`` event naming this slot's job. The
slot stops taking trials when the search is held or cancelled, when its environment differs from
the contract, or when its first attempts failed alike (``task.stops_turn``). On the scheduler's
signal it checkpoints the running trial and is requeued while work is left. A search of gangs runs
in slots of the gang's shape: rank 0 is the slot, every other rank trains its share of each trial
rank 0 takes (``worker/peer.peer_slot``) until rank 0 dismisses it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import UncompletedJobError

from parcel_hpc import anchor
from parcel_hpc.fsio import owner_only_writes
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import AttemptEnd, RecordView, SearchDir, Started, TrialRecord, TrialSpec, TrialWriter
from parcel_hpc.ledger.events import FailureSignature
from parcel_hpc.propose.proposals import Proposer
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.scheduler.slots import Candidate, Queued, choose, expected_s, free_to_take, peers
from parcel_hpc.worker.attempt import AttemptRun
from parcel_hpc.worker.cache import WorkerCache
from parcel_hpc.worker.gang import GangEnv, dismiss
from parcel_hpc.worker.jobenv import enter_gang, facts_from_env, signal_cause
from parcel_hpc.worker.peer import peer_slot
from parcel_hpc.worker.plan import WorkerPlan
from parcel_hpc.worker.result import Ran, WorkerResult
from parcel_hpc.worker.signals import StepBoundarySignals
from parcel_hpc.worker.task import stops_turn

START_MARGIN_S = 10.0  # a trial is started only this long before the scheduler's warning, at the latest
LEASE_POLL_S = 0.05  # how often a slot waiting for another's proposal looks again (jittered)
MAX_LOST_RACES = 64  # proposals another slot recorded first, in a row, before this slot leaves the rest to others


class SlotTask:
    plans: tuple[WorkerPlan, ...] = ()  # a slot is handed no trial: it takes them
    own_limits = True  # each attempt stops at its own limit: the job's is the slot's

    def __init__(
        self,
        search_dir: str,
        launch_id: str,
        name: str,
        minutes: int,
        template: Mapping[str, Any],
        proposals: int = 0,
        max_trials: int = 0,
        signal_delay_s: int = 0,
        shape: TrialShape | None = None,
    ) -> None:
        self.search_dir = search_dir
        self.launch_id = launch_id
        self.name = self.slot = name  # unique in its search: slots/<name>.json records its job
        self.minutes = minutes
        self.template = dict(template)  # a proposal's plan is this with the trial's own fields
        self.proposals = proposals  # the launch's n_trials for a sampler that learns; 0 takes only queued trials
        self.max_trials = max_trials  # hydra.launcher.pack_size when fixed; 0: as many as fit
        self.signal_delay_s = signal_delay_s
        # A search of several shapes has slots of each: this one's job is of ``shape`` and it takes only
        # queued trials of that shape. None: the search's one shape (every trial fits its job).
        self.shape = shape
        self._run: AttemptRun | None = None
        self._gang: GangEnv | None = None  # a slot shaped like the search's gangs: this task's rank in it
        self._rank_lost = False  # a rank left the gang in the last trial: the slot is requeued whole for it
        self._peers_gone = False  # a trial failed: its ranks' processes end, none waits to be dismissed
        self._taken = ""  # a trial this slot took whose attempt has not started: a requeue runs it first
        self._search: SearchDir | None = None

    def job_minutes(self, time_limit_min: int) -> int:
        return self.minutes

    def _args(self) -> tuple:
        return (self.search_dir, self.launch_id, self.name, self.minutes, self.template, self.proposals, self.max_trials, self.signal_delay_s, self.shape)

    def __getstate__(self) -> dict:
        return {"args": self._args()}

    def __setstate__(self, state: dict) -> None:
        self.__init__(*state["args"])  # type: ignore[misc]  # unpickling runs the constructor on the new instance

    # --- the slot -------------------------------------------------------------------------------
    def __call__(self) -> list[WorkerResult]:
        owner_only_writes()
        anchor.enter(self.search_dir)  # held by the job's gate already; a slot run by hand holds its own now
        began = time.monotonic()
        deadline = began + 60.0 * self.minutes - self.signal_delay_s - START_MARGIN_S
        gang = self._gang = enter_gang(int(self.template.get("gpus", 0)))
        rank_wait_s = float(self.template.get("rank_wait_s", WorkerPlan.rank_wait_s))  # a launch recorded before gangs: the plan's default
        if gang is not None and gang.rank > 0:
            # A slot shaped like the search's gangs: this rank trains its share of each trial rank 0 takes.
            return peer_slot(self.search_dir, gang, rank_wait_s, 60.0 * self.minutes)
        results = self._take_turns(deadline, facts_from_env(gang=gang))
        if gang is not None and not self._peers_gone:
            dismiss(gang, rank_wait_s)  # no trial left: its peers, waiting for the next one, exit
        return results

    def _take_turns(self, deadline: float, facts: Started) -> list[WorkerResult]:
        cache = WorkerCache()
        search = self._search = SearchDir(Path(self.search_dir))
        view = RecordView(search)
        proposer = Proposer(search, search.contract(), self.proposals, self.launch_id) if self.proposals else None
        results: list[WorkerResult] = []
        ran: list[FailureSignature | None] = []
        own = [r for r in view.records() if left_here(r, facts.job_id)]
        while True:
            if search.hold() is not None or search.cancellation() is not None or search.launch_stopped(self.launch_id):
                break  # held (trials failing alike), cancelled, or its launch stopped (drift): it starts nothing more
            if self.max_trials and len(results) >= self.max_trials:
                break
            record = own.pop(0) if own else self._take(search, view, facts, deadline - time.monotonic(), first=not results)
            if record is None and proposer is not None:
                record = self._propose(search, view, facts, proposer, deadline, first=not results)
            if record is None:
                break
            results.append(self._attempt(record, facts, cache))
            if why := stops_turn(search, record.trial_id, ran) or self._gang_ended(search, record.trial_id):
                results.append(WorkerResult("", Ran.SLOT_STOPPED, why, slot=self.name))
                break
        return results

    def _gang_ended(self, search: SearchDir, trial_id: str) -> str:
        """Why a slot of gangs runs no more trials after this one ("" to go on): it failed, and a
        failing rank ends its process, which ends the gang's process group with it (on SLURM, srun
        ends the slot's other tasks): a fresh slot runs the trials left."""
        last = search.record(trial_id).attempts[-1:] if self._gang is not None else []
        if last and last[0].how is AttemptEnd.FAILED:
            self._peers_gone = True
            return "a rank of the gang failed, which ends its processes: a fresh slot runs the trials left"
        return ""

    def _attempt(self, record: TrialRecord, facts: Started, cache: WorkerCache) -> WorkerResult:
        assert self._search is not None  # set by __call__ before any attempt
        plan = WorkerPlan.load(self._search, record.trial_id)
        try:
            self._run = AttemptRun(plan, facts, cache, limit_s=60.0 * plan.time_limit_min, prior=record, gang=self._gang)
            self._taken = ""
            result = self._run.execute()
            self._rank_lost = result.again and self._gang is not None
            return result
        except UncompletedJobError:
            raise
        except Exception as exc:  # journaled by the attempt: the slot goes on with the next trial
            return WorkerResult(plan.trial_id, Ran.FAILED, f"{type(exc).__name__}: {exc}"[:500])
        finally:
            pending = self._run.signals.pending[:1] if self._run is not None else []
            if self._run is not None:
                self._run.release_claim()
            self._run = None
            if pending:
                signal.raise_signal(pending[0])  # the warning came after the trial's last step: requeue now (``checkpoint``)
            elif self._rank_lost:
                # A rank left the gang: its interruption is recorded; the slot is requeued whole, every
                # rank restarted together, and resumes this trial first (``checkpoint``, ``left_here``).
                signal.raise_signal(signal.SIGUSR2)

    def _take(self, search: SearchDir, view: RecordView, facts: Started, remaining_s: float, first: bool) -> TrialRecord | None:
        """Take a queued dispatch: the longest expected that fits, created exclusively; None when none fits."""
        records = {r.trial_id: r for r in view.records()}
        known = peers(records.values())
        limit_s = 60.0 * float(self.template["time_limit_min"])  # the contract pins it: every trial's plan says the same
        candidates: list[Candidate] = []
        for tid, n in search.queued():
            record = records.get(tid)
            if record is None:
                continue  # its spec is not visible here yet
            taken, withdrawn = search.dispatch_mark(tid, n, "taken"), search.dispatch_mark(tid, n, "withdrawn")
            latest = search.dispatch_count(tid)
            if not free_to_take(record, n, taken, withdrawn, latest):
                if taken or withdrawn or n != latest or record.state.is_finished() or len(record.jobs) >= n:
                    search.dequeue(tid, n)  # nobody will take it: its entry goes
                continue
            if self.shape is not None and record.spec.shape != self.shape:
                continue  # a trial of another shape: a slot of its shape takes it
            candidates.append(Candidate(Queued(tid, n), expected_s(record.spec.params, known, limit_s), limit_s))
        while (pick := choose(candidates, remaining_s, first)) is not None:
            candidates = [c for c in candidates if c.queued != pick]
            if self._claim(search, pick, facts):
                return view.record(pick.trial_id)
        return None

    def _claim(self, search: SearchDir, queued: Queued, facts: Started) -> bool:
        """Take dispatch ``queued`` and journal its submission by this slot's job; False when another
        slot took it first or its launcher withdrew it (a stop) meanwhile."""
        tid, n = queued.trial_id, queued.dispatch
        if not search.take_dispatch(tid, n, facts.job_id, self.name):
            return False
        search.dequeue(tid, n)
        if search.dispatch_mark(tid, n, "withdrawn") or search.dispatch_count(tid) != n:
            return False  # withdrawn, or given up for a newer dispatch, as it was taken: that one runs
        TrialWriter(search.trial_dir(tid), "slot").submitted(facts.job_id, backend_of(facts.executor).executor, self.launch_id)
        self._taken = tid
        return True

    def _propose(self, search: SearchDir, view: RecordView, facts: Started, proposer: Proposer, deadline: float, first: bool) -> TrialRecord | None:
        """The sampler's next proposal, admitted, planned and taken by this slot; None when no more
        proposals may be made, or a trial's time limit no longer fits the time left (nothing is drawn
        then: a proposal is never left behind by a slot that ends)."""
        limit_s = 60.0 * float(self.template["time_limit_min"])
        for spec in proposer.finish_orphans(time.time()):  # their asker died between record and trial (a detached search has no launcher to)
            if (record := self._take_proposed(search, view, facts, proposer, spec)) is not None:
                return record
        lost = 0
        while lost < MAX_LOST_RACES:
            if proposer.remaining() == 0 or (not first and limit_s > deadline - time.monotonic()):
                return None
            # The scheduler's warning waits until the proposal is recorded, its trial written and taken:
            # a slot preempted in between would leave a record or a trial no one dispatches.
            with StepBoundarySignals() as held:
                made = proposer.propose(view.records)
                record = self._take_proposed(search, view, facts, proposer, made.spec) if made is not None and made.spec is not None else None
                held.deliver()  # a requeue now resumes the trial just taken first (``left_here``)
            if record is not None:
                return record
            if made is None:
                if proposer.stopped:
                    return None
                if proposer.waiting is not None:  # another slot draws proposal k: this one asks for k + 1 once it is recorded
                    proposer.await_record(proposer.waiting, LEASE_POLL_S)
                else:
                    lost += 1  # another asker recorded proposal k first: this one asks for k + 1
        return None  # lost MAX_LOST_RACES draws in a row: the other slots make the proposals left

    def _take_proposed(self, search: SearchDir, view: RecordView, facts: Started, proposer: Proposer, spec: TrialSpec) -> TrialRecord | None:
        """A new proposal's trial admitted, planned, queued and taken by this slot; None when refused,
        when a launcher adopting an orphaned proposal claimed its dispatch first (it queues it), or
        when another free slot took it from the queue first (it runs it; this slot proposes again:
        each proposal still goes to a free slot, so the slots never run more trials than they are)."""
        tid = spec.trial_id
        if not proposer.adopt(spec, WorkerPlan.for_trial(self.template, spec), TrialWriter(search.trial_dir(tid), "slot")).is_admit:
            return None
        n = search.claim_dispatch(tid, self.launch_id, 0)
        if n is None:
            return None
        search.enqueue(tid, n, self.launch_id)  # queued and taken at once: the queue is the one way in
        return view.record(tid) if self._claim(search, Queued(tid, n), facts) else None

    # --- the scheduler's signal -----------------------------------------------------------------
    def checkpoint(self, *_args: Any, **_kwargs: Any) -> submitit.helpers.DelayedSubmission | None:
        """submitit's hook on SIGUSR2: save and record the running trial, and requeue the slot while
        that trial or any other work is left (the requeued slot resumes that trial first)."""
        run = self._run
        again = False
        if run is not None:
            again = run.interrupt(signal_cause(run.facts))
            run.release_claim()
        if again or self._taken or self._rank_lost or self._work_left():
            return submitit.helpers.DelayedSubmission(SlotTask(*self._args()))
        return None

    def _work_left(self) -> bool:
        search = self._search or SearchDir(Path(self.search_dir))
        if search.hold() is not None or search.cancellation() is not None:
            return False
        return bool(search.queued()) or (self.proposals > 0 and len(search.proposal_numbers()) < self.proposals)


def left_here(record: TrialRecord, job_id: str) -> bool:
    """A trial a requeued slot runs first: this job took it last, and either its attempt was
    interrupted (preempted, timed out) here or the scheduler's warning came before it started. One
    that failed or ended without saying how is the launcher's to dispatch (alone: ``runs_alone``),
    never rerun here without a dispatch claim."""
    mine = bool(record.jobs) and record.jobs[-1] == job_id and not record.state.is_finished()
    return mine and not record.skipped_in_turn()
