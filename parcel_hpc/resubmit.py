"""``parcel-hpc resubmit``: after node drains or failures, rerun exactly the trials whose jobs ended
without a result for infrastructure reasons, under the same trial_ids, from their own checkpoints.

Facts come from the scheduler (squeue for what is alive, sacct for how the rest ended), never from
guesses. ``decide`` is pure: records + scheduler facts -> what to resolve, resubmit, give up on.
Completed, pruned, rejected, budget-exhausted and reproducibly failed trials are never touched.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from . import resolution
from .accounting import JobRun, JobState
from .budget import launch_decision
from .dispatch import Dispatcher, LauncherSettings, Submitted, make_dispatcher, packing
from .errors import GovernanceRefusal, SchedulerUnavailable, UsageError
from .ledger import Event, LauncherState, SearchDir, TrialRecord, TrialWriter, fold, preview
from .lifecycle import Action, RetryPolicy, next_action
from .resolution import Resolution, SchedulerFacts
from .sweep.display import commitment_text
from .sweep.pulse import Pulse
from .sweep.search import Follower, account_decision, choose_packing
from .worker import TrialTask, WorkerPlan


@dataclass(frozen=True)
class Resubmission:
    trial_id: str
    reason: str
    exclude_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResubmitPlan:
    resolve: tuple[Resolution, ...] = ()
    resubmit: tuple[Resubmission, ...] = ()
    give_up: tuple[tuple[str, str], ...] = ()
    untouched: tuple[tuple[str, str], ...] = ()  # (trial, why) for the report


def decide(
    records: Iterable[TrialRecord],
    events: Mapping[str, Sequence[Event]],
    facts: SchedulerFacts,
    *,
    dispatches: Mapping[str, int],
    policy: RetryPolicy,
    now: float,
    in_flight: Iterable[str] = (),
) -> ResubmitPlan:
    """What to resolve, resubmit and give up on (pure). A trial this plan resolves is decided on its
    events folded with the resolution it would write (``events`` holds the histories of the trials
    whose last attempt needs one), so the decision reads exactly what the ledger will say.

    ``in_flight``: trials whose latest dispatch another launcher claimed and has not submitted yet.
    """
    in_flight = set(in_flight)
    resolve, resubmit, give_up, untouched = [], [], [], []
    for rec in records:
        if rec.state.is_finished():
            untouched.append((rec.trial_id, rec.state.value))
            continue
        if not rec.jobs:
            untouched.append((rec.trial_id, "never dispatched: relaunch the search to dispatch it"))
            continue
        job = rec.jobs[-1]
        if rec.trial_id in in_flight:
            untouched.append((rec.trial_id, "another launcher is dispatching it right now"))
            continue
        if not facts.job_gone(rec):
            untouched.append((rec.trial_id, f"job {job} is still queued or running"))
            continue
        for res in resolution.resolve([rec], facts, resolution.RESUBMIT):
            resolve.append(res)
            rec = fold(rec.spec, [*events[rec.trial_id], preview(res.attempt, res.ending, now)])
        nxt = next_action(rec, dispatches=dispatches.get(rec.trial_id, 0), job_alive=False, policy=policy)
        if nxt.action in (Action.RETRY, Action.DISPATCH):
            why = _why(rec.cause.value if rec.cause is not None else "lost", facts.runs.get(job, ()), nxt.reason)
            resubmit.append(Resubmission(rec.trial_id, why, _failed_nodes(rec.jobs, facts.runs)))
        elif nxt.action is Action.GIVE_UP:
            give_up.append((rec.trial_id, nxt.reason))
        else:
            untouched.append((rec.trial_id, nxt.reason or rec.state.value))
    return ResubmitPlan(tuple(resolve), tuple(resubmit), tuple(give_up), tuple(untouched))


def _why(cause: str, runs: Sequence[JobRun], action: str) -> str:
    seen = runs[-1].state.text if runs else "gone from the queue"
    return f"{cause} ({seen}); {action}".strip("; ")


def _failed_nodes(jobs: Sequence[str], runs: Mapping[str, Sequence[JobRun]]) -> tuple[str, ...]:
    nodes: set[str] = set()
    for job in jobs:
        for run in runs.get(job, ()):
            if run.state is JobState.NODE_FAIL and run.node_list and run.node_list != "None assigned":
                nodes.add(run.node_list)
    return tuple(sorted(nodes))


# --- the edge: ask the scheduler, journal, dispatch ------------------------------------------------


def run(search: SearchDir, *, dry_run: bool, wait: bool, console: Console) -> ResubmitPlan:
    contract = search.contract()
    cancelled = search.cancellation()
    if cancelled is not None:
        raise GovernanceRefusal("reject:cancelled", f"{search.path} was cancelled by {cancelled.get('by')}: nothing of it is resubmitted")
    recorded = search.last_launcher()
    if recorded is None:
        raise UsageError(f"{search.path} has no dispatched launch to resubmit from; launch the search first")
    settings = LauncherSettings.from_json(recorded)
    dispatcher = make_dispatcher(settings, search)
    dispatcher.check()
    account = dispatcher.account_limits()  # an unknown account is refused here, before anything is written
    records, facts = resolution.observe(search, list(search.records()), resolution.RESUBMIT, every_gone_job=True)
    if facts.slurm_error:
        raise SchedulerUnavailable(facts.slurm_error)
    launch_id = "resubmit-" + time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    # Only the trials a resolution may touch are read again: their previews fold over their events.
    events = {r.trial_id: search.events(r.trial_id) for r in records if resolution.needs_resolution(r)}
    dispatches = {r.trial_id: search.dispatch_count(r.trial_id) for r in records}
    plan = decide(
        records,
        events,
        facts,
        dispatches=dispatches,
        policy=RetryPolicy.from_budget(contract["budget"]),
        now=time.time(),
        in_flight=[r.trial_id for r in records if search.dispatch_in_flight(r.trial_id, launch_id, r)],
    )
    console.print(render(plan, dry_run))
    decision = verdict = None
    if plan.resubmit:
        decision = launch_decision(contract, len(plan.resubmit), len(search.trial_ids()) - len(plan.resubmit), search.path)
        verdict, text = account_decision(account, decision, choose_packing(dispatcher, search, len(plan.resubmit)).size)
        if dry_run:
            console.print(commitment_text(decision), markup=False, highlight=False)
            if text:
                console.print(text, markup=False, highlight=False)
    if dry_run:
        return plan
    writers: dict[str, TrialWriter] = {}

    def writer(trial_id: str) -> TrialWriter:
        return writers.setdefault(trial_id, search.writer(trial_id, "resubmit"))

    resolution.record(plan.resolve, writer)
    for tid, reason in plan.give_up:
        writer(tid).gave_up(reason)
    if decision is None or verdict is None:
        return plan
    decision.require()  # a resubmission that would overshoot a cap is refused (hold:budget, exit 3)
    if not verdict.ok:
        print(text, file=sys.stderr)
        verdict.require()  # nor one the account's association limits cannot hold
    with Pulse(search, launch_id) as pulse:  # list and status --watch see it at work
        resubmitted = _dispatch(search, dispatcher, plan, launch_id, dispatches)
        console.print(f"resubmitted {len(resubmitted)} trials: " + ", ".join(f"{s.trial_id}->{s.job_id}" for s in resubmitted))
        if wait or not dispatcher.can_detach:
            plans = {s.trial_id: WorkerPlan.load(search, s.trial_id) for s in resubmitted}
            Follower(search, dispatcher, plans, launch_id, contract, console, 0.5).follow()
            pulse.leaving(LauncherState.ENDED)
        else:
            pulse.leaving(LauncherState.DETACHED)
    return plan


def _dispatch(search: SearchDir, dispatcher: Dispatcher, plan: ResubmitPlan, launch_id: str, dispatches: Mapping[str, int]) -> list[Submitted]:
    groups: dict[tuple[str, ...], list[str]] = {}
    for item in plan.resubmit:
        if search.claim_dispatch(item.trial_id, launch_id, dispatches[item.trial_id]) is not None:
            groups.setdefault(item.exclude_nodes, []).append(item.trial_id)
    out = []
    for exclude, tids in groups.items():

        def record(submitted: Sequence[Submitted], exclude: tuple[str, ...] = exclude) -> None:
            for s in submitted:
                search.writer(s.trial_id, "resubmit").submitted(s.job_id, dispatcher.name, launch_id, exclude)

        size = choose_packing(dispatcher, search, len(tids)).size
        records = {t: search.record(t) for t in tids}
        tasks = [TrialTask([WorkerPlan.load(search, t) for t in pack]) for pack in packing.groups(tids, size, records)]
        out.extend(dispatcher.submit(tasks, record, exclude_nodes=exclude))
    return out


def render(plan: ResubmitPlan, dry_run: bool) -> Table:
    table = Table(title="resubmit" + (" (dry run: nothing changed)" if dry_run else ""))
    for col in ("trial", "action", "why", "exclude nodes"):
        table.add_column(col)
    for r in plan.resubmit:
        table.add_row(r.trial_id, "resubmit", r.reason, ",".join(r.exclude_nodes))
    for tid, why in plan.give_up:
        table.add_row(tid, "give up", why, "")
    for r in plan.resolve:
        table.add_row(r.trial_id, "resolve", f"attempt {r.attempt} of job {r.ending.job_id}: {r.ending.how.value} ({r.ending.cause.value})", "")
    if not (plan.resubmit or plan.give_up or plan.resolve):
        table.add_row("-", "nothing", f"{len(plan.untouched)} trials need nothing", "")
    return table
