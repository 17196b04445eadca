"""``parcel-hpc resubmit``: after node drains or failures, rerun exactly the trials whose jobs ended
without a result for infrastructure reasons, under the same trial_ids, from their own checkpoints.

Facts come from the scheduler (squeue for what is alive, sacct for how the rest ended), never from
guesses. ``decide`` is pure: records + scheduler facts -> what to resolve, resubmit, give up on.
Completed, pruned, rejected, budget-exhausted and reproducibly failed trials are never touched.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .accounting import Attempt as SacctAttempt
from .accounting import JobState
from .ledger.records import TrialRecord
from .ledger.states import AttemptEnd, FailureClass
from .lifecycle import Action, next_action

_CAUSE = {
    JobState.NODE_FAIL: "node_fail",
    JobState.BOOT_FAIL: "node_fail",
    JobState.PREEMPTED: "preempted",
    JobState.TIMEOUT: "timeout",
    JobState.DEADLINE: "timeout",
    JobState.CANCELLED: "cancelled",
    JobState.REVOKED: "cancelled",
}


@dataclass(frozen=True)
class Resolution:
    """An attempt the ledger thinks is running, with how the scheduler says it ended."""

    trial_id: str
    attempt: int
    job_id: str
    how: AttemptEnd
    cause: str
    final: bool = False


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


def decide(records: Iterable[TrialRecord], alive_jobs: Iterable[str], sacct: Sequence[SacctAttempt], *,
           dispatches: Mapping[str, int], max_retries: int, max_preemptions: int,
           in_flight: Iterable[str] = ()) -> ResubmitPlan:
    """``in_flight``: trials whose latest dispatch another launcher claimed and has not submitted yet."""
    in_flight = set(in_flight)
    alive = set(alive_jobs)
    by_job = runs_by_job(sacct)
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
        if job in alive:
            untouched.append((rec.trial_id, f"job {job} is still queued or running"))
            continue
        rows = by_job.get(job, [])
        last = rows[-1] if rows else None
        if last is not None and last.state.is_active():
            # sacct still says running but squeue does not know it: the controller lost it.
            last = None
        cause = interruption_cause(last.state) if last is not None else "lost"
        unended = rec.attempts[-1] if rec.attempts and rec.attempts[-1].how is None else None
        folded = rec
        if unended is not None:
            if last is not None and last.state is JobState.OUT_OF_MEMORY:
                prior = sum(1 for f in rec.failures if f == FailureClass.OUT_OF_MEMORY.value)
                r = Resolution(rec.trial_id, unended.number, job, AttemptEnd.FAILED, FailureClass.OUT_OF_MEMORY.value, final=prior >= 1)
            else:
                r = Resolution(rec.trial_id, unended.number, job, AttemptEnd.LOST if cause == "lost" else AttemptEnd.INTERRUPTED, cause)
            resolve.append(r)
            folded = _with_resolution(rec, r)
        nxt = next_action(folded, dispatches=dispatches.get(rec.trial_id, 0), job_alive=False,
                          max_retries=max_retries, max_preemptions=max_preemptions)
        if nxt.action in (Action.RETRY, Action.DISPATCH):
            resubmit.append(Resubmission(rec.trial_id, f"{cause} ({last.state.text if last else 'gone from the queue'}); {nxt.reason}".strip("; "),
                                         _failed_nodes(rec, by_job)))
        elif nxt.action is Action.GIVE_UP:
            give_up.append((rec.trial_id, nxt.reason))
        else:
            untouched.append((rec.trial_id, nxt.reason or folded.state.value))
    return ResubmitPlan(tuple(resolve), tuple(resubmit), tuple(give_up), tuple(untouched))


def runs_by_job(sacct: Iterable[SacctAttempt]) -> dict[str, list[SacctAttempt]]:
    """Each job id's runs in the order SLURM ran them (a requeued job has several)."""
    by_job: dict[str, list[SacctAttempt]] = {}
    for a in sacct:
        by_job.setdefault(a.job_id, []).append(a)
    for rows in by_job.values():
        rows.sort(key=lambda a: a.attempt)
    return by_job


def interruption_cause(state: JobState) -> str:
    """The ledger's cause word for how the scheduler says a run ended without a result."""
    return _CAUSE.get(state, "lost")


def _failed_nodes(rec: TrialRecord, by_job: Mapping[str, list[SacctAttempt]]) -> tuple[str, ...]:
    nodes: set[str] = set()
    for job in rec.jobs:
        for a in by_job.get(job, []):
            if a.state is JobState.NODE_FAIL and a.node_list and a.node_list != "None assigned":
                nodes.add(a.node_list)
    return tuple(sorted(nodes))


def _with_resolution(rec: TrialRecord, r: Resolution) -> TrialRecord:
    """The record as it will read once the resolution is journaled (keeps ``decide`` pure)."""
    from dataclasses import replace

    from .ledger.states import TrialState

    attempts = rec.attempts[:-1] + (replace(rec.attempts[-1], how=r.how, cause=r.cause),)
    if r.how is AttemptEnd.FAILED:
        state = TrialState.FAILED if r.final else TrialState.QUEUED
        return replace(rec, attempts=attempts, state=state, failures=rec.failures + (r.cause,),
                       reason=r.cause if r.final else f"retry: {r.cause} once")
    return replace(rec, attempts=attempts, state=TrialState.QUEUED, interrupted=rec.interrupted + 1, reason=f"interrupted: {r.cause}")


# --- the edge: ask the scheduler, journal, dispatch ------------------------------------------------

def run(search, *, dry_run: bool, wait: bool, console) -> ResubmitPlan:
    from . import slurm
    from .accounting import attempts, build_sacct_argv, parse_sacct, run_sacct
    from .budget._search import launch_decision
    from .errors import UsageError
    from .sweep.dispatch import _local_pid_alive, make_dispatcher

    contract = search.contract()
    settings = next((l["launcher"] for l in reversed(search.launches()) if l.get("launcher")), None)
    if settings is None:
        raise UsageError(f"{search.path} has no dispatched launch to resubmit from; launch the search first")
    budget = contract["budget"]
    dispatcher = make_dispatcher(settings["kind"], settings["params"], search, settings["resources"], settings["budget"])
    records = list(search.records())
    open_jobs = [r.jobs[-1] for r in records if not r.state.is_finished() and r.jobs]
    if settings["kind"] == "slurm":
        dispatcher.check()
        alive = set()
        for name in search.slurm_job_names():
            alive |= set(slurm.queued_jobs(name))
        sacct_rows = attempts(parse_sacct(run_sacct(build_sacct_argv(open_jobs)), source="sacct")) if open_jobs else []
    else:
        alive = {j for j in open_jobs if _local_pid_alive(j)}
        sacct_rows = []
    launch_id = "resubmit-" + time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    plan = decide(records, alive, sacct_rows, dispatches={r.trial_id: search.dispatch_count(r.trial_id) for r in records},
                  max_retries=int(budget["max_retries"]), max_preemptions=int(budget.get("max_preemptions", 10)),
                  in_flight=[r.trial_id for r in records if search.dispatch_in_flight(r.trial_id, launch_id, r)])
    console.print(render(plan, dry_run))
    if dry_run:
        return plan
    for r in plan.resolve:
        search.journal(r.trial_id, "resubmit").append(
            "resolved" if r.how is not AttemptEnd.FAILED else "ended", attempt=r.attempt, how=r.how.value, cause=r.cause,
            final=r.final, job_id=r.job_id, message="resolved from the scheduler's accounting by parcel-hpc resubmit")
    for tid, reason in plan.give_up:
        search.journal(tid, "resubmit").append("gave_up", state="failed", cause="retries_exhausted", reason=reason)
    if not plan.resubmit:
        return plan
    decision = launch_decision(contract, len(plan.resubmit), len(search.trial_ids()) - len(plan.resubmit), search.path)
    decision.require()  # a resubmission that would overshoot a cap is refused (hold:budget, exit 3)
    resubmitted = _dispatch(search, dispatcher, plan, launch_id)
    console.print(f"resubmitted {len(resubmitted)} trials: " + ", ".join(f"{s.trial_id}->{s.job_id}" for s in resubmitted))
    if wait or not dispatcher.can_detach:
        from .sweep.search import Follower

        plans = {s.trial_id: search.plan(s.trial_id) for s in resubmitted}
        Follower(search, dispatcher, plans, launch_id, contract, console, 0.5).follow()
    return plan


def _dispatch(search, dispatcher, plan: ResubmitPlan, launch_id: str) -> list:
    from .worker.task import TrialTask

    groups: dict[tuple[str, ...], list[str]] = {}
    for item in plan.resubmit:
        if search.claim_dispatch(item.trial_id, launch_id) is not None:
            groups.setdefault(item.exclude_nodes, []).append(item.trial_id)
    out = []
    for exclude, tids in groups.items():
        submitted = dispatcher.submit([TrialTask(search.plan(t)) for t in tids], exclude_nodes=",".join(exclude))
        for s in submitted:
            search.journal(s.trial_id, "resubmit").append("submitted", job_id=s.job_id, executor=dispatcher.name,
                                                          launch_id=launch_id, exclude_nodes=list(exclude))
        if hasattr(dispatcher, "release"):
            dispatcher.release(submitted)
        out.extend(submitted)
    return out


def render(plan: ResubmitPlan, dry_run: bool):
    from rich.table import Table

    table = Table(title="resubmit" + (" (dry run: nothing changed)" if dry_run else ""))
    for col in ("trial", "action", "why", "exclude nodes"):
        table.add_column(col)
    for r in plan.resubmit:
        table.add_row(r.trial_id, "resubmit", r.reason, ",".join(r.exclude_nodes))
    for tid, why in plan.give_up:
        table.add_row(tid, "give up", why, "")
    for r in plan.resolve:
        table.add_row(r.trial_id, "resolve", f"attempt {r.attempt} of job {r.job_id}: {r.how.value} ({r.cause})", "")
    if not (plan.resubmit or plan.give_up or plan.resolve):
        table.add_row("-", "nothing", f"{len(plan.untouched)} trials need nothing", "")
    return table
