"""``parcel-hpc resubmit``: after node drains or failures, rerun exactly the trials whose jobs ended
without a result for infrastructure reasons, under the same trial_ids, from their own checkpoints.

Facts come from the scheduler (squeue for what is alive, sacct for how the rest ended), never from
guesses; what to do is ``lifecycle.resubmit.decide`` (pure). This module asks, journals and dispatches
through the launch's Follower.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter

from rich.console import Console
from rich.table import Table

from parcel_hpc import anchor
from parcel_hpc.budget import launch_decision
from parcel_hpc.console import safe
from parcel_hpc.errors import SchedulerUnavailable, UsageError
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.launch.display import commitment_text
from parcel_hpc.launch.follow import Follower, account_decision, choose_packing
from parcel_hpc.launch.pulse import Pulse
from parcel_hpc.launch.search import refuse_held
from parcel_hpc.ledger import LauncherState, SearchDir
from parcel_hpc.lifecycle import resolution, settlement
from parcel_hpc.lifecycle.actions import RetryPolicy
from parcel_hpc.lifecycle.resubmit import ResubmitPlan, decide
from parcel_hpc.scheduler.base import LauncherSettings
from parcel_hpc.scheduler.factory import make_dispatcher
from parcel_hpc.worker import WorkerPlan


def run(search: SearchDir, *, dry_run: bool, wait: bool, console: Console) -> ResubmitPlan:
    contract = search.contract()
    cancelled = search.cancellation()
    if cancelled is not None:
        raise GovernanceRefusal(Outcome.reject("cancelled"), f"{search.path} was cancelled by {cancelled.get('by')}: nothing of it is resubmitted")
    refuse_held(search)
    recorded = search.last_launcher()
    if recorded is None:
        raise UsageError(f"{search.path} has no dispatched launch to resubmit from; launch the search first")
    settings = LauncherSettings.from_json(recorded)
    dispatcher = make_dispatcher(settings, search)
    dispatcher.acts_for(anchor.identify(search.path))  # the directory as this door found it: its jobs hold it
    dispatcher.check()
    account = dispatcher.account_limits()  # an unknown account is refused here, before anything is written
    records, facts = resolution.observe(search, list(search.records()), resolution.RESUBMIT, every_gone_job=True)
    if facts.queue_error:
        raise SchedulerUnavailable(facts.queue_error)
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
    if not dry_run:
        settlement.settle_ended(search)  # holds an ended attempt still has are not charged to the resubmission
    if plan.resubmit:
        shapes = Counter(search.spec(item.trial_id).shape for item in plan.resubmit)  # each its own
        decision = launch_decision(contract, len(plan.resubmit), len(search.trial_ids()) - len(plan.resubmit), search.path, shapes)
        verdict, text = account_decision(account, decision, choose_packing(dispatcher, search, len(plan.resubmit)).size)
        if dry_run:
            console.print(commitment_text(decision), markup=False, highlight=False)
            if text:
                console.print(text, markup=False, highlight=False)
    if dry_run:
        return plan
    follower = Follower(search, dispatcher, {}, launch_id, contract, console, 0.5, role="resubmit")
    resolution.record(search, plan.resolve, follower.writer)
    follower.record_runs(trials=[r.trial_id for r in records])  # the scheduler's record of the runs that ended, as sync records it
    for tid, reason in plan.give_up:
        follower.writer(tid).gave_up(reason)
    if decision is None or verdict is None:
        return plan
    decision.require()  # a resubmission that would overshoot a cap is refused (hold:budget, exit 3)
    if not verdict.ok:
        print(text, file=sys.stderr)
        verdict.require()  # nor one the account's association limits cannot hold
    plans = {item.trial_id: WorkerPlan.load(search, item.trial_id) for item in plan.resubmit}  # what ran first, rerun as it was
    follower.plans = dict(plans)
    with Pulse(search, launch_id) as pulse:  # list and status --watch see it at work
        resubmitted = follower.resubmit(plan.resubmit, dispatches)
        console.print(f"resubmitted {len(resubmitted)} trials: " + ", ".join(f"{s.trial_id}->{s.job_id}" for s in resubmitted), markup=False)
        if wait or not dispatcher.can_detach:
            follower.plans = {s.trial_id: plans[s.trial_id] for s in resubmitted}
            follower.follow()
            if follower.stop is not None:
                raise GovernanceRefusal(follower.stop.outcome, follower.stop_detail())  # the launch's stop, the same way
            pulse.leaving(LauncherState.ENDED)
        else:
            pulse.leaving(LauncherState.DETACHED)
    return plan


def render(plan: ResubmitPlan, dry_run: bool) -> Table:
    table = Table(title="resubmit" + (" (dry run: nothing changed)" if dry_run else ""))
    for col in ("trial", "action", "why", "exclude nodes"):
        table.add_column(col)
    for r in plan.resubmit:
        table.add_row(safe(r.trial_id), "resubmit", safe(r.reason), safe(",".join(r.exclude_nodes)))
    for tid, why in plan.give_up:
        table.add_row(safe(tid), "give up", safe(why), "")
    for res in plan.resolve:
        assert res.ending.cause is not None  # ending_from_accounting always names a cause
        table.add_row(
            safe(res.trial_id), "resolve", safe(f"attempt {res.attempt} of job {res.ending.job_id}: {res.ending.how.value} ({res.ending.cause.value})"), ""
        )
    if not (plan.resubmit or plan.give_up or plan.resolve):
        table.add_row("-", "nothing", f"{len(plan.untouched)} trials need nothing", "")
    return table
