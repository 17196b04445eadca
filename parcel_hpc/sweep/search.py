"""A governed search launch: freeze, propose, dedup, admit, commit the budget, dispatch, follow.

Order is the contract with the user: nothing is dispatched before the contract is frozen (or
matched), every proposal is deduplicated and admitted, and the worst-case budget is admitted for
the whole launch; a refusal happens before the first sbatch, never after.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from .. import resolution
from ..budget import AssociationLimit, BudgetDecision, admit_account, launch_decision, render_account
from ..console import make_console
from ..contract import Contract, TrialIdentity, admit, first_difference, freeze_contract, load_contract
from ..data import read_split
from ..dispatch import Dispatcher, Submitted, packing
from ..errors import GovernanceRefusal, ReleaseFailed, SchedulerUnavailable, UsageError
from ..ledger import LauncherState, RecordView, SearchDir, TrialRecord, TrialSpec, TrialWriter
from ..lifecycle import Action, Next, RetryPolicy, next_action
from ..selection.store import write_final_plan
from ..worker import TrialTask, WorkerPlan
from . import display
from .proposals import Proposer
from .pulse import Pulse
from .samplers import SamplerSpec
from .specs import build_contract, check_policy, ensure_writable, history_free_specs, in_frozen_form, plan_for, sampler_of, search_path, trial_id_of


@dataclass
class LaunchReport:
    search_dir: Path
    launch_id: str
    contract_digest: str
    proposed: int = 0
    duplicates: dict[str, str] = field(default_factory=dict)  # trial_id -> twin
    finished_before: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    dispatched: list[str] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)
    dry_run: bool = False
    launcher: dict = field(default_factory=dict)
    packing: dict = field(default_factory=dict)  # the pack size and why
    follows: bool = True  # it follows its trials to the end (search.wait); False: detached
    user: str = field(default_factory=getpass.getuser)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return {
            "launcher": self.launcher,
            "launch_id": self.launch_id,
            "contract_digest": self.contract_digest,
            "proposed": self.proposed,
            "duplicates": self.duplicates,
            "finished_before": self.finished_before,
            "rejected": self.rejected,
            "dispatched": self.dispatched,
            "jobs": self.jobs,
            "dry_run": self.dry_run,
            "packing": self.packing,
            "follows": self.follows,
            "user": self.user,
            "host": self.host,
            "pid": self.pid,
            "at": self.at,
        }


class SearchLaunch:
    def __init__(
        self, cfg: Mapping[str, Any], dispatcher_factory: Callable[[SearchDir], Dispatcher], console: Console | None = None, poll_s: float = 0.5
    ) -> None:
        self.cfg = cfg
        self.dispatcher_factory = dispatcher_factory
        self.console = console or make_console()
        self.poll_s = poll_s

    def run(self) -> LaunchReport:
        cfg = self.cfg
        started = time.time()
        path = search_path(cfg)
        n_trials = int(cfg["search"]["n_trials"])
        if n_trials < 0:
            raise UsageError(f"search.n_trials={n_trials} must be >= 0")
        contract = build_contract(cfg)  # validates every input file before anything is written
        search = SearchDir(path)
        _refuse_cancelled(search)
        fresh = not (path / "contract.json").exists()
        if not fresh:
            contract = in_frozen_form(contract, load_contract(path))  # a search frozen by an older version continues
        if fresh:
            check_policy(contract)
        dispatcher = self.dispatcher_factory(search)
        dispatcher.check()  # an unreachable scheduler is refused before anything is written
        if not cfg["search"]["wait"] and not dispatcher.can_detach:
            raise UsageError(
                "search.wait=false needs a scheduler: the local executor runs trials as children of this process; use hydra/launcher=submitit_slurm"
            )
        sampler = sampler_of(contract)
        if not cfg["search"]["wait"] and sampler.learns:
            raise UsageError(
                f"sampler={sampler.name.value} proposes each trial when a slot frees, so its launcher follows the search: drop search.wait=false, "
                "or draw with sampler=random or sampler=qmc to detach"
            )
        max_trials = int(contract["budget"]["max_trials"])
        if n_trials > max_trials:
            raise GovernanceRefusal(
                "hold:budget",
                f"search.n_trials={n_trials} exceeds budget.max_trials={max_trials}; lower search.n_trials to {max_trials} or start a new search revision with a larger budget",
            )
        account = dispatcher.account_limits()  # an unknown account is refused here, before anything is written
        if fresh and n_trials:
            # Hold before freezing: a held first launch must leave the caps free to change.
            first = launch_decision(contract, n_trials, 0, None)
            self._require_budget(first)
            self._require_budget(*account_decision(account, first))
        dry_run = bool(cfg["search"]["dry_run"])
        if dry_run:
            frozen, created = self._dry_freeze(path, contract, fresh)
        else:
            ensure_writable(path)
            frozen, created = freeze_contract(path, contract)
            if created or not search.launches():
                # What names this search's jobs on the scheduler. A search launched before ids
                # existed keeps its bare job name: renaming it would hide its queued jobs.
                search.ensure_identity(frozen.digest)
            if created or not search.trial_ids():
                # The revision's final evaluation plan is fixed when its contract froze (or by the next
                # launch, when that one died before proposing anything); never added to a search later.
                write_final_plan(path, frozen, cfg["split"]["path"], read_split(cfg["split"]["path"]).final_digest)
        launch_id = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        report = LaunchReport(path, launch_id, frozen.digest, dry_run=dry_run, follows=bool(cfg["search"]["wait"]))

        proposer = None
        if sampler.learns:
            proposer = Proposer(search, frozen, n_trials, launch_id)
        # From here on the launch says it is alive (list, status --watch), and last how it left.
        with Pulse(search, launch_id, beating=not dry_run) as pulse:
            specs = self._admit_proposals(search, frozen, n_trials, report, proposer)
            to_dispatch = [s.trial_id for s in specs]
            to_propose = 0 if proposer is None else (n_trials if dry_run and fresh else proposer.remaining())
            if not to_dispatch and not to_propose:
                self.console.print(display.contract_line(frozen, path, created, dry_run))
                self.console.print(display.nothing_to_do(report))
                if not report.dry_run:
                    search.write_launch(launch_id, report.to_json())
                    if cfg["search"]["wait"]:
                        self.console.print(display.summary(search, time.time() - started))
                pulse.withdraw()  # it dispatched nothing: the launches before it say how the search stands
                return report
            known = set(search.trial_ids()) | set(to_dispatch)
            decision = launch_decision(frozen, len(to_dispatch) + to_propose, len(known) - len(to_dispatch), None if dry_run and fresh else path)
            self._require_budget(decision)
            pack = choose_packing(dispatcher, search, len(to_dispatch) + to_propose, sampler)
            verdict, account_text = account_decision(account, decision, pack.size)
            self._require_budget(verdict, account_text)
            self.console.print(display.contract_line(frozen, path, created, dry_run))
            self.console.print(display.commitment_text(decision))
            if account_text:
                self.console.print(account_text, markup=False, highlight=False)
            if report.dry_run:
                self.console.print(display.dry_run_table(specs, frozen))
                if to_propose:
                    self.console.print(display.learning_line(sampler, to_propose, dispatcher.slots()), markup=False, highlight=False, soft_wrap=True)
                self.console.print(display.worst_case_line(decision))
                self.console.print(display.packing_line(pack, len(specs)))
                lengths = [len(g) for g in packing.groups(to_dispatch, pack.size)]
                self.console.print(dispatcher.describe(lengths), soft_wrap=True, markup=False, highlight=False)
                return report
            if to_propose:
                self.console.print(display.learning_line(sampler, to_propose, dispatcher.slots()), markup=False, highlight=False, soft_wrap=True)
            report.launcher = dispatcher.launch_record()
            search.write_launch(launch_id, report.to_json())
            for tid in to_dispatch:
                # The first plan stands for the trial's life (its checkpoint directory must not move under
                # a retry); resubmit rebuilds tasks from it without the launch's config.
                search.write_plan(tid, plan_for(search.spec(tid), cfg, frozen, path).to_json())
            plans = {tid: WorkerPlan.load(search, tid) for tid in to_dispatch}
            follower = Follower(search, dispatcher, plans, launch_id, frozen, self.console, self.poll_s)
            follower.dispatch_initial(report)
            search.write_launch(launch_id, report.to_json())
            if cfg["search"]["wait"]:
                if proposer is not None:
                    follower.proposing(proposer, lambda spec: plan_for(spec, cfg, frozen, path), report)
                follower.follow()
                if proposer is not None:
                    search.write_launch(launch_id, report.to_json())  # with what it proposed as it went
                pulse.leaving(LauncherState.ENDED)
                self.console.print(display.summary(search, time.time() - started))
            else:
                pulse.leaving(LauncherState.DETACHED)
                self.console.print(display.detached_text(search, report))
            return report

    @staticmethod
    def _dry_freeze(path: Path, contract: Contract, fresh: bool) -> tuple[Contract, bool]:
        """A dry run checks against the frozen contract (or would freeze this one) without writing."""
        if fresh:
            return contract, True
        frozen = load_contract(path)
        name = first_difference(frozen.fields, contract.fields)
        if name is not None:
            raise GovernanceRefusal(f"reject:{name}", f"{name} differs from the contract frozen in {path}; a changed search needs a new search.revision")
        return frozen, False

    @staticmethod
    def _require_budget(decision: BudgetDecision, text: str = "") -> None:
        """A hold prints its outcome first (stdout), the table (``text``, else the commitment's) on stderr, and exits 3."""
        if not decision.ok:
            print(text or display.commitment_text(decision), file=sys.stderr)
            decision.require()

    def _admit_proposals(self, search: SearchDir, contract: Contract, n_trials: int, report: LaunchReport, proposer: Proposer | None) -> list[TrialSpec]:
        """Dedup and admit every proposal; the specs that need a dispatch now. A dry run writes nothing.
        A sampler that learns proposes later, as slots free: here only its trials proposed before."""
        out = []
        owners: dict[str, str] = {}
        if proposer is None:
            candidates = history_free_specs(contract, 0, n_trials)
        else:
            if not report.dry_run:
                proposer.finish_orphans(time.time())
            candidates = [search.spec(tid) for tid in search.trial_ids()]
        for spec in candidates:
            report.proposed += 1
            if report.dry_run:
                owner = owners.setdefault(spec.config_hash, search.config_owner(spec.config_hash) or spec.trial_id)
            else:
                owner = search.claim_config(spec.config_hash, spec.trial_id)
            if owner != spec.trial_id:
                report.duplicates[spec.trial_id] = owner
                continue
            if not report.dry_run:
                search.write_spec(spec)  # no-op when an earlier launch proposed it
            known = (search.trial_dir(spec.trial_id) / "spec.json").exists()
            if known and search.record(spec.trial_id).state.is_finished():
                report.finished_before.append(spec.trial_id)
                continue
            outcome = admit(TrialIdentity.for_contract(spec.trial_id, contract, spec.config_hash), contract)
            if outcome != "admit":
                if not report.dry_run:
                    search.writer(spec.trial_id, "launch").admission_refused(outcome, report.launch_id)
                report.rejected[spec.trial_id] = outcome
                continue
            out.append(spec)
        return out


OUTAGE_LIMIT_S = 900.0  # how long a launch waits for a scheduler that stopped answering


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
    """How many trials a job of this dispatch runs, from the launcher's options and the search's history."""
    if sampler is not None and sampler.learns:
        return packing.Packing(1, f"one a job: sampler={sampler.name.value} proposes each trial when a slot frees")
    params, resources = dispatcher.settings.params, dispatcher.settings.resources
    size = params.get("pack_size", 1)  # a launch recorded before packing existed resubmits as it ran: one a job
    minutes = params.get("pack_minutes")
    by_length = minutes is not None and packing.pack_option(size) is None
    measured = packing.expected_trial_s(search.records()) if by_length else (None, 0)
    limit = float(resources["time_limit_min"])
    return packing.decide(size, n_trials, dispatcher.slots(), limit, minutes, measured, dispatcher.max_job_minutes())


def _refuse_cancelled(search: SearchDir) -> None:
    cancelled = search.cancellation()
    if cancelled is not None:
        raise GovernanceRefusal(
            "reject:cancelled",
            f"{search.path} was cancelled by {cancelled.get('by')} ({cancelled.get('reason')}); a cancelled search stays stopped: start a new search.revision",
        )


class Follower:
    """Dispatches, retries and follows the trials of one launch until none needs anything."""

    def __init__(
        self, search: SearchDir, dispatcher: Dispatcher, plans: Mapping[str, WorkerPlan], launch_id: str, contract: Contract, console: Console, poll_s: float
    ) -> None:
        self.search = search
        self.dispatcher = dispatcher
        self.plans = dict(plans)
        self.launch_id = launch_id
        self.contract = contract
        self.console = console
        self.poll_s = poll_s
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

    def proposing(self, proposer: Proposer, plan_of: Callable[[TrialSpec], WorkerPlan], report: LaunchReport) -> None:
        """From now on each free slot gets a new proposal, told every result known at that moment."""
        self.proposer, self.plan_of, self.report = proposer, plan_of, report

    def writer(self, trial_id: str) -> TrialWriter:
        """One journal per trial for this launch, opened when it first has something to say."""
        if trial_id not in self.writers:
            self.writers[trial_id] = self.search.writer(trial_id, "launch")
        return self.writers[trial_id]

    def dispatch_initial(self, report: LaunchReport) -> None:
        self.dispatcher.refresh()  # an earlier detached launch's jobs may still be queued or running
        self.dispatcher.max_job_minutes()  # asks the scheduler now, before any dispatch is claimed (packing reads it)
        released = self.dispatcher.recover({j for r in self.search.records() for j in r.jobs})
        if released:
            self.console.print(f"released {len(released)} held arrays an earlier launch submitted but never released: {', '.join(released)}")
        for tid in self.plans:
            record = self.search.record(tid)
            nxt = self._next(record)
            if nxt.action is Action.RESOLVE_LOST:
                self._resolve_vanished(record)
                record = self.search.record(tid)
                nxt = self._next(record)
            self._act(tid, nxt)
        report.dispatched = list(self.waiting)
        self.packing = choose_packing(self.dispatcher, self.search, len(self.waiting), sampler_of(self.contract))
        report.packing = self.packing.to_json()
        if self.waiting:
            self.console.print(display.packing_line(self.packing, len(self.waiting)))
        self._submit_waiting()
        report.jobs = {tid: rec.jobs[-1] for tid in report.dispatched if (rec := self.search.record(tid)).jobs}

    def _next(self, record: TrialRecord) -> Next:
        tid = record.trial_id
        alive = bool(record.jobs) and self.dispatcher.alive(tid, record.jobs[-1])
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

    def _act(self, tid: str, nxt: Next) -> None:
        if nxt.action in (Action.RETRY, Action.DISPATCH) and (cancelled := self.search.cancellation()) is not None:
            # The search was cancelled after this launch read its trials: this one too, never dispatched.
            self.writer(tid).cancelled(str(cancelled.get("by", "")), str(cancelled.get("reason", "")), True)
            return
        if nxt.action is Action.RESOLVE_LOST:
            self._resolve_vanished(self.search.record(tid))
        elif nxt.action in (Action.RETRY, Action.DISPATCH):
            n = self.search.claim_dispatch(tid, self.launch_id, self.seen_dispatches[tid])
            if n is not None:
                self.claims[tid] = n
                self.waiting.append(tid)
        elif nxt.action is Action.GIVE_UP:
            self.writer(tid).gave_up(nxt.reason)

    def _submit_waiting(self, read: Mapping[str, TrialRecord] | None = None) -> None:
        """``read``: records the caller read this round (each waiting trial's is folded only once)."""
        if self.waiting and self.search.cancellation() is not None:
            self.waiting = []  # cancelled while they waited for a free slot: never submitted
        if not self.waiting:
            return
        # A trial cancelled while it waited is finished: its place goes to the next one.
        records = {tid: read[tid] if read is not None and tid in read else self.search.record(tid) for tid in self.waiting}
        self.waiting = [tid for tid in self.waiting if not records[tid].state.is_finished()]
        packs = packing.groups(self.waiting, self.packing.size, records)
        batch: list[str] = []
        self.recorded = set()
        try:
            packs = packs[: self.dispatcher.capacity()]  # may ask the controller: inside, so a failure gives the claims back
            batch = [tid for pack in packs for tid in pack]
            self.waiting = [tid for tid in self.waiting if tid not in set(batch)]
            if not packs:
                return
            self.dispatcher.submit([TrialTask([self.plans[tid] for tid in pack]) for pack in packs], self._record_submitted)
        except SchedulerUnavailable as exc:
            # Give back the claims of what never reached the scheduler, so a relaunch dispatches those
            # trials at once; arrays submitted and recorded (released or not) keep their own.
            for tid in [t for t in batch if t not in self.recorded] + self.waiting:
                self.search.withdraw_dispatch(tid, self.claims.pop(tid), self.launch_id)
            self.waiting = []
            if isinstance(exc, ReleaseFailed):
                raise
            submitted = (
                f"{len(self.recorded)} of the batch's {len(batch)} trials were submitted, the rest not"
                if self.recorded
                else "nothing of this batch was submitted"
            )
            raise SchedulerUnavailable(f"{exc}; {submitted} and the search is resumable: fix that, then rerun the same launch to continue it") from None

    def _total(self) -> int:
        return len(self.plans) + (self.proposer.remaining() if self.proposer is not None else 0)

    def _propose(self) -> int:
        """Fill this launcher's free slots with proposals; 1 while proposals remain, one was made now,
        or a recorded one still lacks its trial (the launch goes on to follow them), else 0. A slot
        is free while fewer of this launcher's trials are unfinished than it has slots (a trial
        waiting for a retry holds its slot); another launcher's slots are its own."""
        if self.search.cancellation() is not None:
            return 0
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
                continue  # another launcher recorded proposal k first (for a slot of its own): this slot takes k + 1
            self.report.proposed += 1
            if made.spec is None:
                self.report.duplicates[made.record.trial_id] = made.twin
                continue
            self._adopt(made.spec)
            adopted += 1
        if self.proposer.stopped and not self.stop_said:
            self.console.print(f"[yellow]proposals stopped: {self.proposer.stopped}[/]")
            self.stop_said = True
        return 1 if self.proposer.remaining() > 0 or adopted or self.proposer.unwritten() else 0

    def _adopt(self, spec: TrialSpec) -> None:
        """Follow a new proposal's trial: admit it, write its plan, claim its first dispatch."""
        tid = spec.trial_id
        if tid in self.plans:
            return
        outcome = admit(TrialIdentity.for_contract(tid, self.contract, spec.config_hash), self.contract)
        if outcome != "admit":
            self.writer(tid).admission_refused(outcome, self.launch_id)
            self.report.rejected[tid] = outcome
            return
        self.search.write_plan(tid, self.plan_of(spec).to_json())
        self.plans[tid] = WorkerPlan.load(self.search, tid)
        self.report.dispatched.append(tid)
        self._act(tid, self._next(self.search.record(tid)))

    def _record_submitted(self, submitted: Sequence[Submitted]) -> None:
        for s in submitted:
            self.writer(s.trial_id).submitted(s.job_id, self.dispatcher.name, self.launch_id)
            self.recorded.add(s.trial_id)

    def _resolve_vanished(self, record: TrialRecord) -> None:
        """Its job is gone but the ledger says running: record how the scheduler says it ended."""
        records, facts = resolution.observe(self.search, [record], resolution.FOLLOWER, seen_ending=record.jobs[-1:])
        resolution.record(resolution.resolve(records, facts, resolution.FOLLOWER), self.writer)

    def _refresh(self) -> bool:
        """Ask the scheduler; False while it does not answer (a restarting slurmctld): nothing is
        decided on a stale answer then, and after ``OUTAGE_LIMIT_S`` the launch stops following."""
        try:
            self.dispatcher.refresh()
        except SchedulerUnavailable as exc:
            now = time.monotonic()
            if self.outage_since is None:
                self.outage_since = now
                self.console.print(f"[yellow]the scheduler is not answering ({exc}); waiting for it: the trials keep running[/]")
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

    def follow(self) -> None:
        with display.Progress(self.console, self._total()) as progress:
            while True:
                round_started = time.monotonic()
                if not self._refresh():
                    time.sleep(max(self.poll_s, 2.0))
                    continue
                active = 0
                states = []
                waiting_records = {}
                for tid in self.plans:
                    record = self.view.record(tid)
                    states.append(record.state)
                    if tid in self.waiting:
                        waiting_records[tid] = record
                        active += 1
                        continue
                    nxt = self._next(record)
                    if nxt.action is not Action.NONE:
                        active += 1
                        self._act(tid, nxt)
                if self.proposer is not None:
                    active += self._propose()
                self._submit_waiting(waiting_records)
                progress.update(states, self._total())  # the states read this round
                if active == 0:
                    return
                # A round looks at every trial: with many trials it is long, so the launch never spends
                # more than a third of its time reading (the workers it waits for share the machine).
                spent = time.monotonic() - round_started
                self.dispatcher.wait(max(self.poll_s, 2.0 * spent), at_least=2.0 * spent)
