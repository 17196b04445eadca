"""The Follower: dispatches, retries, proposes into free slots and follows one launch's trials
until none needs anything, and the one submit-and-record path (the launch and ``resubmit`` use it).

Owns: turning ``next_action`` decisions into dispatch claims, submissions and journal lines; the
scheduler-outage wait (``OUTAGE_LIMIT_S``); recording the scheduler's record of its trials' runs as
sacct files them (``record_runs``: every ``ACCOUNT_EVERY_S``, and at the launch's end for up to
``ACCOUNT_WAIT_S``); the packing of what it submits; stopping (``Stop``) on
the first worker that finds the environment drifted from the contract, or when the first trials
fail alike (``lifecycle.systematic``): nothing more is dispatched, jobs not yet started are
cancelled, and the trials already running are followed to their end.
Must not: freeze or admit a search's contract (``search.py`` did, before it was made).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rich.console import Console

from parcel_hpc.budget import AssociationLimit, BudgetDecision, admit_account, render_account
from parcel_hpc.console import safe
from parcel_hpc.errors import AccountingError, ReleaseFailed, SchedulerUnavailable
from parcel_hpc.governance import validation
from parcel_hpc.governance.admission import admit_proposal
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.governance.shape import ShapePlan, TrialShape
from parcel_hpc.launch import display
from parcel_hpc.launch.report import LaunchReport
from parcel_hpc.launch.slot import SlotTask
from parcel_hpc.ledger import RecordView, SearchDir, TrialRecord, TrialSpec, TrialState, TrialWriter
from parcel_hpc.lifecycle import resolution, systematic
from parcel_hpc.lifecycle.actions import Action, Next, RetryPolicy, next_action
from parcel_hpc.lifecycle.resubmit import Resubmission
from parcel_hpc.propose.proposals import ORPHAN_AFTER_S, Proposer
from parcel_hpc.propose.samplers import SamplerSpec
from parcel_hpc.propose.specs import sampler_of, trial_id_of
from parcel_hpc.scheduler import packing, slots
from parcel_hpc.scheduler.base import Dispatcher, Submitted
from parcel_hpc.worker import TrialTask, WorkerPlan

OUTAGE_LIMIT_S = 900.0  # how long a launch waits for a scheduler that stopped answering
TAKE_GRACE_S = 60.0  # a slot journals its submission a moment after taking a dispatch: longer, and it died between
LOOK_MARGIN_S = 5.0  # hosts' clocks agree within this (NTP); a job recorded this close to a look is not judged by it
ACCOUNT_EVERY_S = 30.0  # how often a following launch asks sacct for the runs it filed (one call for every job lacking one)
ACCOUNT_WAIT_S = 60.0  # how long a launch's end waits for sacct to file its trials' last runs (slurmdbd files them in seconds)


def account_decision(account: tuple[str, list[AssociationLimit]] | None, decision: BudgetDecision, pack_size: int = 1) -> tuple[BudgetDecision, str]:
    """The worst case against the association limits of the account the jobs are charged to
    (``Dispatcher.account_limits``), with the text to print ("" where jobs are charged to no account).
    ``pack_size`` trials a job: its time limit is theirs together."""
    if account is None:
        return decision, ""
    name, limits = account
    c = decision.commitment
    verdict = admit_account(c, limits, name, packing.job_time_limit_min(pack_size, int(c.time_limit_min)))
    return verdict, render_account(verdict, name)


def choose_packing(dispatcher: Dispatcher, search: SearchDir, n_trials: int, sampler: SamplerSpec | None = None) -> packing.Packing:
    """How many trials a job of this dispatch runs, from the launcher's options and the search's
    history (a slot: its time limit, room for that many trials at their limit)."""
    slotted = sampler is not None and uses_slots(dispatcher, sampler)
    if (shape := ShapePlan.of(dispatcher.settings.resources).largest).is_gang and not slotted:
        # A search of several shapes has a gang among them: one a job, so no pack mixes shapes either.
        return packing.Packing(1, f"one a job: a trial of {shape.ranks} ranks is a job of its own")
    if sampler is not None and sampler.learns and not slotted:
        return packing.Packing(1, f"one a job: sampler={sampler.name.value} proposes each trial when a slot frees")
    params, resources = dispatcher.settings.params, dispatcher.settings.resources
    size = params.get("pack_size", 1)  # a launch recorded before packing existed resubmits as it ran: one a job
    minutes = params.get("pack_minutes")
    by_length = minutes is not None and validation.pack_option(size) is None
    measured = packing.expected_trial_s(search.records()) if by_length else (None, 0)
    limit = float(resources["time_limit_min"])
    return packing.decide(size, n_trials, dispatcher.slots(), limit, minutes, measured, dispatcher.max_job_minutes())


def detached_slots(chosen: packing.Packing, work: int, dispatcher: Dispatcher) -> packing.Packing:
    """Detached, no launcher submits a fresh slot: the first ones must hold every trial at its time
    limit, one more each for the time a slot cannot use at its end (within the partition's MaxTime)."""
    need = -(-work // max(1, dispatcher.slots())) + 1
    limit, longest = float(dispatcher.settings.resources["time_limit_min"]), dispatcher.max_job_minutes()
    fit = validation.MAX_PACK if longest is None else max(1, int(longest // max(limit, 1e-9)))
    size = min(max(chosen.size, need), fit, validation.MAX_PACK)
    return chosen if size == chosen.size else packing.Packing(size, f"{chosen.basis}; detached: room for all {work} at their limit over the slots")


def uses_slots(dispatcher: Dispatcher, sampler: SamplerSpec) -> bool:
    """Whether this launch's trials run in slots that take them (``hydra.launcher.dispatch``); a gang's
    slot is a job of the gang's shape, its ranks running each trial together."""
    return validation.dispatch_option(dispatcher.settings.params.get("dispatch")).slotted(sampler.learns)


@dataclass(frozen=True)
class SlotPlan:
    """What every slot of a launch is told: the plan template its proposals' plans are made from, how
    many proposals the search may have (0: a fixed list), and the most trials a slot runs (0: as
    many as its time holds)."""

    template: Mapping[str, Any]
    proposals: int
    max_trials: int
    detached: bool = False  # no launcher follows: the slots first submitted must hold every trial at its limit


@dataclass(frozen=True)
class Stop:
    """Why a launch stopped dispatching: its outcome and, for people, what happened and what to do."""

    outcome: Outcome
    why: str
    drift: bool  # the environment differs from the contract: the same launch runs the rest once it matches

    def detail(self, queued: int) -> str:
        if self.drift:
            return f"{self.why}; dispatching stopped: restore the environment and relaunch the same command to run the {queued} queued trials"
        return self.why


def admitted(spec: TrialSpec, contract: Contract, report: LaunchReport, writer: TrialWriter | None) -> bool:
    """The launch side's admission of one proposal, however it was proposed: a refusal is journaled
    (``writer``; None in a dry run, which writes nothing) and reported."""
    outcome = admit_proposal(spec.trial_id, spec.config_hash, contract)
    if outcome.is_admit:
        return True
    if writer is not None:
        writer.admission_refused(outcome, report.launch_id)
    report.rejected[spec.trial_id] = str(outcome)
    return False


class Follower:
    """Dispatches, retries and follows the trials of one launch until none needs anything."""

    def __init__(
        self,
        search: SearchDir,
        dispatcher: Dispatcher,
        plans: Mapping[str, WorkerPlan],
        launch_id: str,
        contract: Contract,
        console: Console,
        poll_s: float,
        role: str = "launch",  # the journals it writes: "launch", or "resubmit"
    ) -> None:
        self.search = search
        self.dispatcher = dispatcher
        self.plans = dict(plans)
        self.launch_id = launch_id
        self.contract = contract
        self.console = console
        self.poll_s = poll_s
        self.role = role
        self.policy = RetryPolicy.from_budget(contract["budget"])
        self.writers: dict[str, TrialWriter] = {}
        self.waiting: list[str] = []  # admitted, dispatch claimed, not yet submitted (local capacity)
        self.claims: dict[str, int] = {}  # trial -> the dispatch number this launcher claimed for it
        self.outage_since: float | None = None  # when the scheduler stopped answering, while it does not
        self.packing = packing.Packing(1, "one a job: retries after the first dispatch")  # dispatch_initial decides
        self.recorded: set[str] = set()  # trials of the batch being submitted whose job ids are recorded
        self.seen_dispatches: dict[str, int] = {}  # trial -> its dispatch count when last decided on
        self.view = RecordView(search)  # each poll folds only the trials whose journals changed
        self.proposer: Proposer | None = None  # a sampler that learns: proposes into free slots (``proposing``)
        self.plan_of: Callable[[TrialSpec], WorkerPlan] | None = None
        self.report: LaunchReport | None = None
        self.stop_said = False
        self.looked_at = 0.0  # when the scheduler was last asked (refresh)
        self.stop: Stop | None = None  # set once: nothing more is dispatched
        self.checks: set[str] = set()  # trials whose dispatch checks whether a failure reproduces
        self.submitted_jobs: dict[str, float] = {}  # the jobs this launcher submitted, and when (a drift stop reads only theirs)
        self.systematic_k = systematic.threshold(contract["budget"])
        self.slot_plan: SlotPlan | None = None  # set by ``slotting``: trials go to slots that take them
        self.queued: dict[str, tuple[int, float]] = {}  # trial -> (its dispatch waiting for a slot, when queued)
        self.slot_jobs: dict[str, tuple[str, float]] = {}  # live slot -> (its job id, when submitted)
        self.slot_shapes: dict[str, TrialShape] = {}  # a search of several shapes: each slot's
        self.slot_count = 0  # slots this launcher submitted
        self.empty_slots = 0  # slots that ended without taking a trial (the churn guard counts them)
        self.known_before: set[str] = set()  # trials that existed when proposing began (slots propose the rest)
        self.accounted_at = 0.0  # when sacct was last asked for the runs it filed (monotonic)
        self.accounting_said = False  # that sacct does not answer was said once

    def slotting(self, plan: SlotPlan) -> None:
        """From now on admitted dispatches are queued for slots, which take them (and propose)."""
        self.slot_plan = plan
        self.known_before = set(self.search.trial_ids())

    def _dispatch_line(self, n_trials: int) -> str:
        if self.slot_plan is None:
            return display.packing_line(self.packing, n_trials)
        return display.slots_line(self.packing, n_trials, self.dispatcher.slots(), self._slot_minutes())

    def _slot_minutes(self) -> int:
        return slots.slot_minutes(self.packing.size, int(self.dispatcher.settings.resources["time_limit_min"]))

    def proposing(self, proposer: Proposer, plan_of: Callable[[TrialSpec], WorkerPlan], report: LaunchReport) -> None:
        """From now on each free slot gets a new proposal, told every result known at that moment."""
        self.proposer, self.plan_of, self.report = proposer, plan_of, report

    def writer(self, trial_id: str) -> TrialWriter:
        """One journal per trial for this launch, opened when it first has something to say."""
        if trial_id not in self.writers:
            self.writers[trial_id] = self.search.writer(trial_id, self.role)
        return self.writers[trial_id]

    def dispatch_initial(self, report: LaunchReport) -> None:
        self.looked_at = time.time()
        self.dispatcher.refresh()  # an earlier detached launch's jobs may still be queued or running
        self.dispatcher.max_job_minutes()  # asks the scheduler now, before any dispatch is claimed (packing reads it)
        known = {j for r in self.search.records() for j in r.jobs} | {str(s.get("job_id", "")) for s in self.search.slot_records()}
        released = self.dispatcher.recover(known)
        if released:
            self.console.print(f"released {len(released)} held arrays an earlier launch submitted but never released: {', '.join(released)}", markup=False)
        for tid in self.plans:
            record = self.search.record(tid)
            nxt = self._next(record)
            if nxt.action is Action.RESOLVE_LOST:
                self._resolve_vanished(record)
                record = self.search.record(tid)
                nxt = self._next(record)
            self._act(tid, nxt)
        report.dispatched = list(self.waiting)
        proposals = self.proposer.remaining() if self.proposer is not None and self.slot_plan is not None else 0
        self.packing = choose_packing(self.dispatcher, self.search, len(self.waiting) + proposals, sampler_of(self.contract))
        if self.slot_plan is not None and self.slot_plan.detached:
            self.packing = detached_slots(self.packing, len(self.waiting) + proposals, self.dispatcher)
        report.packing = self.packing.to_json()
        work = len(self.waiting) + (self.proposer.remaining() if self.proposer is not None and self.slot_plan is not None else 0)
        if work:
            self.console.print(self._dispatch_line(work))
        self._submit_waiting()
        report.jobs = {tid: rec.jobs[-1] for tid in report.dispatched if (rec := self.search.record(tid)).jobs}

    def _next(self, record: TrialRecord) -> Next:
        tid = record.trial_id
        alive = bool(record.jobs) and (self.dispatcher.alive(tid, record.jobs[-1]) or self._newer_than_the_look(record))
        if record.state.is_finished() or alive:
            # Nothing to dispatch whatever the claims say (next_action: NONE or WAIT), so a poll does
            # not list every trial's dispatch claims.
            return next_action(record, dispatches=self.seen_dispatches.get(tid, 0), job_alive=alive, policy=self.policy)
        self.seen_dispatches[tid] = self.search.dispatch_count(tid)  # what a dispatch decided now claims on
        return next_action(
            record,
            dispatches=self.seen_dispatches[tid],
            job_alive=alive,
            policy=self.policy,
            dispatch_in_flight=self.search.dispatch_in_flight(tid, self.launch_id, record),
        )

    def _newer_than_the_look(self, record: TrialRecord) -> bool:
        """Its latest job was submitted after (or just before) the scheduler was last asked: that
        answer cannot say it is gone, so it is waited for, never dispatched again (two launchers
        starting together would otherwise each submit it). A job this launcher submitted is judged by
        its own submission (a slot journals a trial's long after its job was submitted)."""
        ours = self.submitted_jobs.get(record.jobs[-1])
        at = ours if ours is not None else record.submitted_at
        return at is not None and at > self.looked_at - LOOK_MARGIN_S

    def _act(self, tid: str, nxt: Next) -> None:
        if nxt.action in (Action.RETRY, Action.DISPATCH) and (cancelled := self.search.cancellation()) is not None:
            # The search was cancelled after this launch read its trials: this one too, never dispatched.
            self.writer(tid).cancelled(str(cancelled.get("by", "")), str(cancelled.get("reason", "")), True)
            return
        if nxt.action is Action.RESOLVE_LOST:
            self._resolve_vanished(self.search.record(tid))
        elif nxt.action in (Action.RETRY, Action.DISPATCH):
            seen = self.seen_dispatches[tid]
            if seen and len(self.view.record(tid).jobs) < seen:
                # Dispatch ``seen`` never reached a job (its launcher or slot died, or it waits in the
                # queue): taken here first, so no slot can take it once its replacement is claimed.
                if not self.search.take_dispatch(tid, seen, "", f"launch {self.launch_id}"):
                    return  # a slot took it a moment ago: its submission shows next round
                self.search.dequeue(tid, seen)
            n = self.search.claim_dispatch(tid, self.launch_id, seen)
            if n is not None:
                self.claims[tid] = n
                # Whether a failure reproduces decides whether the search goes on: those checks go first.
                checks = sum(1 for t in self.waiting if t in self.checks)
                self.waiting.insert(checks, tid) if nxt.check else self.waiting.append(tid)
                if nxt.check:
                    self.checks.add(tid)
        elif nxt.action is Action.GIVE_UP:
            self.writer(tid).gave_up(nxt.reason)

    def _submit_waiting(self, read: Mapping[str, TrialRecord] | None = None) -> None:
        """``read``: records the caller read this round (each waiting trial's is folded only once)."""
        if self.slot_plan is not None:
            self._feed_slots(read or {})
            return
        if self.waiting and self.search.cancellation() is not None:
            self.waiting = []  # cancelled while they waited for a free slot: never submitted
        if not self.waiting:
            return
        # A trial cancelled while it waited is finished: its place goes to the next one.
        records = {tid: read[tid] if read is not None and tid in read else self.search.record(tid) for tid in self.waiting}
        self.waiting = [tid for tid in self.waiting if not records[tid].state.is_finished()]
        packs = packing.groups(self.waiting, self.packing.size, records)
        self.recorded = set()
        try:
            packs = packs[: self.dispatcher.capacity()]  # may ask the controller: a failure gives the claims back
        except SchedulerUnavailable as exc:
            self._give_back(exc, [])
        batch = {tid for pack in packs for tid in pack}
        self.waiting = [tid for tid in self.waiting if tid not in batch]
        if packs:
            self._submit(packs)

    # --- slots ------------------------------------------------------------------------------------

    def _feed_slots(self, read: Mapping[str, TrialRecord]) -> None:
        """Queue the dispatches claimed this round (a trial that must run alone gets a job of its own),
        forget those a slot took, and keep as many slots alive as there is work, up to the launcher's."""
        assert self.slot_plan is not None  # called in slot mode only
        if self.search.cancellation() is not None:
            for tid, (n, _) in self.queued.items():
                self.search.dequeue(tid, n)  # cancelled: the slots see it too and take nothing more
            self.waiting, self.queued = [], {}
            return
        now = time.time()
        for tid, (n, _) in list(self.queued.items()):
            record = read[tid] if tid in read else self.view.record(tid)
            taken = self.search.taken_at(tid, n)
            if len(record.jobs) >= n or record.state.is_finished():
                del self.queued[tid]  # taken, and its submission journaled
            elif taken is not None and now - taken > TAKE_GRACE_S:
                del self.queued[tid]  # its slot died between taking and journaling: decided again next round
        records = {tid: read[tid] if tid in read else self.view.record(tid) for tid in self.waiting}
        alone = [t for t in self.waiting if not records[t].state.is_finished() and records[t].runs_alone()]
        for tid in self.waiting:
            if tid not in alone and not records[tid].state.is_finished():
                self.search.enqueue(tid, self.claims[tid], self.launch_id)
                self.queued[tid] = (self.claims[tid], now)
        self.waiting = alone
        live = self._live_slots()
        proposals = self.proposer.remaining() if self.proposer is not None and self.stop is None else 0
        if any(not self.view.record(t).state.is_finished() for t in self.checks):
            proposals = 0  # whether a failure reproduces decides whether the search goes on: no fresh slot proposes first
        work = len(self.queued) + proposals
        try:
            capacity = self.dispatcher.capacity()  # may ask the controller: a failure gives the claims back
        except SchedulerUnavailable as exc:
            self._give_back(exc, [])
        own_jobs = min(len(alone), capacity)
        fresh = max(0, min(self.dispatcher.slots() - live, work - live, capacity - own_jobs))
        if self.empty_slots > 2 * self.dispatcher.slots() + 2:
            fresh = 0  # slots keep ending with nothing taken: the follower stops feeding that loop
            if not self.stop_said and work:
                self.console.print(f"[yellow]{self.empty_slots} slots ended without taking a trial: no more slots are submitted by this launch[/]")
                self.stop_said = True
        if own_jobs:
            self.waiting = alone[own_jobs:]
            self._submit([[t] for t in alone[:own_jobs]])
        if not ShapePlan.of(self.dispatcher.settings.resources).mixed:
            if fresh:
                self._submit_slots(fresh)
            return
        # Trials of several shapes (a fixed list: proposals are refused at the launch): slots of each
        # shape, as many as its queued trials need beyond its live slots, the room shared in turn.
        guarded = self.empty_slots > 2 * self.dispatcher.slots() + 2  # the churn guard above
        room = 0 if guarded else max(0, min(self.dispatcher.slots() - live, capacity - own_jobs))
        for shape, n in slots.per_shape(self._queued_shapes(), Counter(self.slot_shapes[name] for name in self.slot_jobs), room).items():
            self._submit_slots(n, shape)

    def _live_slots(self) -> int:
        """This launcher's slots the scheduler still holds (or submitted since it was last asked);
        a slot that left having taken nothing counts towards the churn guard."""
        live = {}
        for name, (job, at) in self.slot_jobs.items():
            if at > self.looked_at - LOOK_MARGIN_S or self.dispatcher.alive(name, job):
                live[name] = (job, at)
            elif not any(job in self.view.record(tid).jobs for tid in self.search.trial_ids()):
                self.empty_slots += 1  # took no trial of this search, whichever launcher's
        self.slot_jobs = live
        return len(live)

    def _queued_shapes(self) -> Counter[TrialShape]:
        """How many queued trials wait for a slot of each shape."""
        return Counter(self.plans[tid].shape if tid in self.plans else self.view.record(tid).spec.shape for tid in self.queued)

    def _submit_slots(self, n: int, shape: TrialShape | None = None) -> None:
        """``n`` slots; of ``shape`` in a search of several shapes (None: the search's one)."""
        assert self.slot_plan is not None  # called in slot mode only
        plan, minutes = self.slot_plan, self._slot_minutes()
        delay = int(self.dispatcher.settings.params.get("signal_delay_s", 0))
        names = [f"{self.launch_id}-s{self.slot_count + i}" for i in range(n)]
        self.slot_count += n
        tasks = [SlotTask(str(self.search.path), self.launch_id, name, minutes, plan.template, plan.proposals, plan.max_trials, delay, shape) for name in names]
        if shape is not None:
            self.slot_shapes.update(dict.fromkeys(names, shape))

        def record(submitted: Sequence[Submitted]) -> None:
            for s in submitted:
                self.search.write_slot(s.slot, {"job_id": s.job_id, "launch_id": self.launch_id, "minutes": minutes, "at": time.time()})
                self.slot_jobs[s.slot] = (s.job_id, time.time())
                self.submitted_jobs[s.job_id] = time.time()

        try:
            self.dispatcher.submit(tasks, record)
        except SchedulerUnavailable as exc:
            self._give_back(exc, [])

    def _follow_slots_proposals(self) -> int:
        """What the slots proposed: each new trial of this launch is followed (retries, the summary);
        1 while proposals remain, one is between its record and its trial, or one was adopted now
        (the round counted its trials before), else 0."""
        assert self.proposer is not None and self.report is not None  # called only after proposing() set them
        if self.search.cancellation() is not None:
            return 0
        orphans = self.proposer.finish_orphans(time.time())
        for spec in orphans:
            self._adopt(spec)  # its slot died between the proposal's record and its trial: queued for another
        for k, twin in self.proposer.duplicates.items():
            self.report.duplicates.setdefault(trial_id_of(k), twin)
        self.proposer.stop_if_spent(self.view.record(tid) for tid in self.plans)
        between = adopted = 0
        for tid in self.search.trial_ids():
            if tid in self.plans or tid in self.known_before or tid in self.report.rejected:
                continue
            record = self.view.record(tid)
            if record.state is TrialState.REJECTED and not (self.search.trial_dir(tid) / "plan.json").exists():
                self.report.rejected[tid] = record.detail  # a slot's admission refused it
                continue
            claim = self.search.trial_dir(tid) / "dispatch-1.json"
            if not claim.exists():
                if time.time() - (self.search.trial_dir(tid) / "spec.json").stat().st_mtime < ORPHAN_AFTER_S:
                    between += 1  # a slot is writing it (plan, then claim)
                else:
                    self._adopt(self.search.spec(tid))  # its slot died between its spec and its claim: queued for another
                    adopted += 1
            elif (self.search.read_object(claim, "a dispatch claim") or {}).get("launch_id") == self.launch_id:
                self.plans[tid] = WorkerPlan.load(self.search, tid)
                self.report.dispatched.append(tid)
                self.report.proposed += 1
                adopted += 1
                if len(record.jobs) < (n := self.search.dispatch_count(tid)):
                    self.queued[tid] = (n, time.time())  # queued or being taken by a slot: never decided again meanwhile
        if self.proposer.stopped and not self.stop_said:
            self.console.print(f"[yellow]proposals stopped: {safe(self.proposer.stopped)}[/]")
            self.stop_said = True
        return 1 if self.proposer.remaining() > 0 or between or adopted or orphans or self.proposer.unwritten() else 0

    def resubmit(self, items: Sequence[Resubmission], dispatches: Mapping[str, int]) -> list[Submitted]:
        """``parcel-hpc resubmit``'s dispatch: claim each trial's next dispatch (one another launcher
        claimed first is its to submit), then submit them, grouped by the nodes each must avoid."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for item in items:
            n = self.search.claim_dispatch(item.trial_id, self.launch_id, dispatches[item.trial_id])
            if n is not None:
                self.claims[item.trial_id] = n
                groups.setdefault(item.exclude_nodes, []).append(item.trial_id)
        out: list[Submitted] = []
        pending = list(groups.items())
        while pending:
            exclude, tids = pending.pop(0)
            self.waiting = [t for _, later in pending for t in later]  # a failure gives their claims back too
            records = {t: self.search.record(t) for t in tids}
            out.extend(self._submit(packing.groups(tids, choose_packing(self.dispatcher, self.search, len(tids)).size, records), exclude))
        self.waiting = []
        return out

    def _submit(self, packs: Sequence[Sequence[str]], exclude_nodes: tuple[str, ...] = ()) -> list[Submitted]:
        """The one submit-and-record path: every trial's job id is journaled before any can start;
        on a failure, what never reached the scheduler gives its dispatch claim back."""
        batch = [tid for pack in packs for tid in pack]
        self.recorded = set()

        def record(submitted: Sequence[Submitted]) -> None:
            for s in submitted:
                self.writer(s.trial_id).submitted(s.job_id, self.dispatcher.name, self.launch_id, exclude_nodes)
                self.recorded.add(s.trial_id)
                self.submitted_jobs[s.job_id] = time.time()

        try:
            return self.dispatcher.submit([TrialTask([self.plans[tid] for tid in pack]) for pack in packs], record, exclude_nodes=exclude_nodes)
        except SchedulerUnavailable as exc:
            self._give_back(exc, batch)

    def _give_back(self, exc: SchedulerUnavailable, batch: Sequence[str]) -> NoReturn:
        """Give back the claims of what never reached the scheduler (the batch's unrecorded trials and
        every trial still waiting), so a relaunch dispatches those trials at once; arrays submitted and
        recorded (released or not) keep their own. Then stop, saying what went out."""
        for tid in [t for t in batch if t not in self.recorded] + self.waiting:
            self.search.withdraw_dispatch(tid, self.claims.pop(tid), self.launch_id)
        self.waiting = []
        if isinstance(exc, ReleaseFailed):
            raise exc
        submitted = (
            f"{len(self.recorded)} of the batch's {len(batch)} trials were submitted, the rest not" if self.recorded else "nothing of this batch was submitted"
        )
        again = "rerun the same launch" if self.role == "launch" else f"rerun `parcel-hpc {self.role}`"
        raise SchedulerUnavailable(f"{exc}; {submitted} and the search is resumable: fix that, then {again} to continue it") from None

    def _total(self) -> int:
        return len(self.plans) + (self.proposer.remaining() if self.proposer is not None else 0)

    def _propose(self) -> int:
        """Fill this launcher's free slots with proposals; 1 while proposals remain, one was made now,
        or a recorded one still lacks its trial (the launch goes on to follow them), else 0. A slot
        is free while fewer of this launcher's trials are unfinished than it has slots (a trial
        waiting for a retry holds its slot); another launcher's slots are its own."""
        if self.slot_plan is not None:
            return self._follow_slots_proposals()
        if self.search.cancellation() is not None:
            return 0
        assert self.proposer is not None and self.report is not None  # called only after proposing() set them
        orphans = self.proposer.finish_orphans(time.time())
        for spec in orphans:
            self._adopt(spec)  # its launcher died between the proposal's record and its trial
        for k, twin in self.proposer.duplicates.items():
            self.report.duplicates.setdefault(trial_id_of(k), twin)
        adopted = len(orphans)
        while self.proposer.remaining() > 0:
            busy = sum(not self.view.record(tid).state.is_finished() for tid in self.plans)
            if min(self.dispatcher.slots() - busy, self.dispatcher.capacity() - len(self.waiting)) <= 0:
                break
            made = self.proposer.propose(lambda: [self.view.record(tid) for tid in self.search.trial_ids()])
            if made is None:
                if self.proposer.waiting is not None:
                    break  # another launcher is drawing proposal k: this slot asks again next round
                continue  # another launcher recorded proposal k first (for a slot of its own): this slot takes k + 1
            self.report.proposed += 1
            if made.spec is None:
                self.report.duplicates[made.record.trial_id] = made.twin
                continue
            self._adopt(made.spec)
            adopted += 1
        if self.proposer.stopped and not self.stop_said:
            self.console.print(f"[yellow]proposals stopped: {safe(self.proposer.stopped)}[/]")
            self.stop_said = True
        return 1 if self.proposer.remaining() > 0 or adopted or self.proposer.unwritten() else 0

    def _adopt(self, spec: TrialSpec) -> None:
        """Follow a new proposal's trial: admit it, write its plan, claim its first dispatch."""
        tid = spec.trial_id
        if tid in self.plans:
            return
        assert self.proposer is not None and self.report is not None and self.plan_of is not None  # called only after proposing() set them
        outcome = self.proposer.adopt(spec, self.plan_of(spec), self.writer(tid))
        if not outcome.is_admit:
            self.report.rejected[tid] = str(outcome)
            return
        self.plans[tid] = WorkerPlan.load(self.search, tid)
        self.report.dispatched.append(tid)
        self._act(tid, self._next(self.search.record(tid)))

    def _resolve_vanished(self, record: TrialRecord) -> None:
        """Its job is gone but the ledger says running: record how the scheduler says it ended."""
        records, facts = resolution.observe(self.search, [record], resolution.FOLLOWER, seen_ending=record.jobs[-1:])
        resolution.record(self.search, resolution.resolve(records, facts, resolution.FOLLOWER), self.writer)

    def _refresh(self) -> bool:
        """Ask the scheduler; False while it does not answer (a restarting slurmctld): nothing is
        decided on a stale answer then, and after ``OUTAGE_LIMIT_S`` the launch stops following."""
        looking = time.time()
        try:
            self.dispatcher.refresh()
            self.looked_at = looking
        except SchedulerUnavailable as exc:
            now = time.monotonic()
            if self.outage_since is None:
                self.outage_since = now
                self.console.print(f"[yellow]the scheduler is not answering ({safe(exc)}); waiting for it: the trials keep running[/]")
            if now - self.outage_since > OUTAGE_LIMIT_S:
                raise SchedulerUnavailable(
                    f"{exc}; still no answer after {OUTAGE_LIMIT_S:.0f}s: trials already queued keep running, "
                    "rerun the same launch (or `parcel-hpc resubmit`) once the scheduler is back to continue the search"
                ) from None
            return False
        if self.outage_since is not None:
            self.console.print(f"the scheduler answers again after {time.monotonic() - self.outage_since:.0f}s")
            self.outage_since = None
        return True

    def record_runs(self, wait_s: float = 0.0, trials: Sequence[str] | None = None) -> None:
        """Record the scheduler's record of every run of this launch's trials (``trials``) that
        sacct has filed and the ledger lacks (``resolution.record_filed_runs``), and restate the
        budget holds it changes. ``wait_s`` (the launch's end): wait that long for sacct to file
        every run an attempt ran in. Accounting that does not answer (slurmdbd down, lagging)
        leaves those hours provisional, said once: it never stops the launch."""
        self.accounted_at = time.monotonic()
        try:
            left = resolution.record_runs_until(self.search, list(self.plans) if trials is None else trials, self.writer, wait_s, read=self.view.record)
        except AccountingError as exc:
            if not self.accounting_said:
                self.console.print(
                    f"[yellow]the scheduler's accounting does not answer ({safe(exc)}): the hours of runs it has not filed stay provisional;"
                    f" `parcel-hpc sync {safe(self.search.path)}` records them later[/]"
                )
                self.accounting_said = True
            return
        if left and wait_s > 0:
            self.console.print(f"[yellow]{safe(resolution.provisional_line(self.search, left))}[/]")

    def follow(self) -> None:
        with display.Progress(self.console, self._total()) as progress:
            while True:
                round_started = time.monotonic()
                self.dispatcher.check_search()  # still the directory the launch found at its door, before it reads or writes
                if not self._refresh():
                    time.sleep(max(self.poll_s, 2.0))
                    continue
                active = 0
                states = []
                waiting_records = {}
                records = {tid: self.view.record(tid) for tid in self.plans}
                self._check_stop(records)
                for tid, record in records.items():
                    states.append(record.state)
                    if tid in self.waiting or (tid in self.queued and not record.state.is_finished()):
                        waiting_records[tid] = record
                        active += 1
                        continue
                    nxt = self._next(record)
                    if nxt.action is Action.NONE or (self.stop is not None and nxt.action in (Action.RETRY, Action.DISPATCH)):
                        continue  # finished, or stopped: nothing more goes out
                    active += 1
                    self._act(tid, nxt)
                if self.proposer is not None and self.stop is None:
                    active += self._propose()
                self._submit_waiting(records if self.slot_plan is not None else waiting_records)
                if time.monotonic() - self.accounted_at >= ACCOUNT_EVERY_S:
                    self.record_runs()
                progress.update(states, self._total())  # the states read this round
                if active == 0:
                    return
                # A round looks at every trial: with many trials it is long, so the launch never spends
                # more than a third of its time reading (the workers it waits for share the machine).
                spent = time.monotonic() - round_started
                self.dispatcher.wait(max(self.poll_s, 2.0 * spent), at_least=2.0 * spent)

    # --- stopping ---------------------------------------------------------------------------------

    def _check_stop(self, records: Mapping[str, TrialRecord]) -> None:
        """Stop on the first drift rejection by a job this launcher submitted (one from before it is what
        it reruns), or on a systematic failure."""
        if self.stop is not None:
            return
        drifted = [r for r in records.values() if r.awaiting_environment() and r.attempts[-1].job_id in self.submitted_jobs]
        if drifted:
            first = min(drifted, key=lambda r: r.attempts[-1].ended or 0.0)
            outcome = first.attempts[-1].outcome
            assert outcome is not None  # a drift ending is a rejection: Ended names its outcome
            self._halt(Stop(outcome, f"{first.trial_id}'s worker: {first.detail}", drift=True), records)
            return
        everything = {tid: self.view.record(tid) for tid in self.search.trial_ids()}
        found = systematic.decide({**everything, **records}.values(), self.systematic_k)
        if found is not None:
            self.search.mark_held({**found.to_json(), "detail": found.text(str(self.search.path)), "launch_id": self.launch_id, "at": time.time()})
            held = self.search.hold()  # the first hold recorded stands (another launcher's, maybe)
            assert held is not None  # just recorded
            self._halt(Stop(Outcome.parse(held["outcome"]), str(held["detail"]), drift=False), records)

    def _halt(self, stop: Stop, records: Mapping[str, TrialRecord]) -> None:
        """Dispatch nothing more: give back the claims of trials waiting for a slot and cancel the jobs
        none of whose trials has started (they would run against the same problem). Trials already
        running go on: the follower waits for them, so the ledger says how each ended."""
        self.stop = stop
        if self.slot_plan is not None:
            self.search.mark_launch_stopped(self.launch_id, str(stop.outcome))  # its slots take and propose nothing more
        for tid in self.waiting:
            self.search.withdraw_dispatch(tid, self.claims.pop(tid), self.launch_id)
        self.waiting = []
        for tid, (n, _) in self.queued.items():
            self.search.withdraw_dispatch(tid, n, self.launch_id)  # a slot taking it now finds it withdrawn and leaves it
            self.search.dequeue(tid, n)
        self.queued = {}
        by_job: dict[str, list[TrialRecord]] = {}
        for r in records.values():
            if r.jobs and not r.state.is_finished() and self.dispatcher.alive(r.trial_id, r.jobs[-1]):
                by_job.setdefault(r.jobs[-1], []).append(r)
        busy = {r.jobs[-1] for t in self.search.trial_ids() if (r := self.view.record(t)).jobs and not r.state.is_finished()}
        for name, (job, _) in self.slot_jobs.items():
            if job not in busy and self.dispatcher.alive(name, job):
                by_job.setdefault(job, [])  # a slot running no trial of the search (another launcher's too): idle or not started
        unstarted = sorted(job for job, recs in by_job.items() if not any(a.job_id == job for r in recs for a in r.attempts))
        if unstarted:
            self.dispatcher.cancel(unstarted)
        running = len(by_job) - len(unstarted)
        self.console.print(
            f"[yellow]{stop.outcome}: dispatching stopped; {len(unstarted)} jobs not yet started cancelled, "
            f"waiting for the {running} jobs already running to end[/]"
        )

    def next_step(self) -> str:
        """What to do once the launch stopped ("" when it did not)."""
        if self.stop is None:
            return ""
        if self.stop.drift:
            return "restore the environment the contract pins, then relaunch the same command"
        return f"parcel-hpc logs {self.search.path}  (why the trials failed alike)"

    def stop_detail(self) -> str:
        """The stop's text with the count of trials it left queued."""
        assert self.stop is not None  # asked only after a stop
        queued = sum(1 for tid in self.plans if not self.search.record(tid).state.is_finished())
        return self.stop.detail(queued)
