"""Which trials a resubmission reruns, resolves or gives up on, and why (pure).

``decide``: records + scheduler facts -> a ``ResubmitPlan``. Completed, pruned, rejected,
budget-exhausted and reproducibly failed trials are never touched. The effects (asking the
scheduler, journaling, dispatching) are ``parcel_hpc.launch.resubmit``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from parcel_hpc.ledger import Event, TrialRecord, fold, preview
from parcel_hpc.lifecycle import resolution
from parcel_hpc.lifecycle.actions import Action, RetryPolicy, next_action
from parcel_hpc.lifecycle.resolution import Resolution, SchedulerFacts
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.states import JobState


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
        if not facts.attempt_over(rec):
            untouched.append((rec.trial_id, f"job {job} is still queued or running"))
            continue
        for res in resolution.resolve([rec], facts, resolution.RESUBMIT):
            resolve.append(res)
            rec = fold(rec.spec, [*events[rec.trial_id], preview(res.attempt, res.ending, now)])
        if facts.runs_again(rec):
            untouched.append((rec.trial_id, f"job {job} was requeued by the scheduler: its next run resumes the trial"))
            continue
        nxt = next_action(rec, dispatches=dispatches.get(rec.trial_id, 0), job_alive=False, policy=policy)
        if nxt.action in (Action.RETRY, Action.DISPATCH):
            why = _why(rec.cause.value if rec.cause is not None else "lost", resolution.attempt_run(rec, facts.runs.get(job, ())), nxt.reason)
            resubmit.append(Resubmission(rec.trial_id, why, _failed_nodes(rec.jobs, facts.runs)))
        elif nxt.action is Action.GIVE_UP:
            give_up.append((rec.trial_id, nxt.reason))
        else:
            untouched.append((rec.trial_id, nxt.reason or rec.state.value))
    return ResubmitPlan(tuple(resolve), tuple(resubmit), tuple(give_up), tuple(untouched))


def _why(cause: str, run: JobRun | None, action: str) -> str:
    """Why a trial is resubmitted: its cause and what sacct says of the run its last attempt ran in."""
    seen = run.state.text if run is not None else "gone from the queue"
    return f"{cause} ({seen}); {action}".strip("; ")


def _failed_nodes(jobs: Sequence[str], runs: Mapping[str, Sequence[JobRun]]) -> tuple[str, ...]:
    nodes: set[str] = set()
    for job in jobs:
        for run in runs.get(job, ()):
            if run.state is JobState.NODE_FAIL and run.node_list and run.node_list != "None assigned":
                nodes.add(run.node_list)
    return tuple(sorted(nodes))
