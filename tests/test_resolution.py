"""What becomes of an attempt whose run ended without its word (pure): a node failure under a
requeued pack or a job of its own, a job gone from the queue, an owner's cancel; what ``resubmit``,
``status`` and ``sync`` decide from the scheduler's own facts, and the squeue text they come from."""

import pytest

from parcel_hpc.errors import SchedulerUnavailable
from parcel_hpc.ledger import Ended, Event, Heartbeat, LauncherState, TrialRecord, TrialSpec, fold, preview
from parcel_hpc.ledger.events import Cause
from parcel_hpc.ledger.searches import launcher_state
from parcel_hpc.ledger.states import AttemptEnd, TrialState
from parcel_hpc.lifecycle import resolution
from parcel_hpc.lifecycle.actions import RetryPolicy
from parcel_hpc.lifecycle.resolution import SchedulerFacts
from parcel_hpc.lifecycle.resubmit import decide
from parcel_hpc.scheduler.base import QueuedJob, QueueState
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slurm.queue import parse_squeue, queue_state
from parcel_hpc.scheduler.states import JobState

POLICY = RetryPolicy(max_retries=2, max_preemptions=10)
PACK = "5_0"


def spec(tid: str) -> TrialSpec:
    n = int(tid[1:])
    return TrialSpec(tid, n, {"lr": 0.1 * (n + 1)}, n, "sha256:" + f"{n + 1:x}" * 64, "sha256:" + "2" * 64, "sha256:" + "3" * 64, {"gpus": 1, "cpus": 1})


def ev(kind: str, t: float, **kw) -> Event:
    base = {"submitted": {"executor": "slurm", "launch_id": "l1"}, "started": {"executor": "slurm", "node": "n3", "host": "vm"}}.get(kind, {})
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": t, **base, **kw})


def history(tid: str, job: str, *more: Event, started: bool = True) -> list[Event]:
    """Submitted to ``job``; its attempt 1 started in the job's first run (unless not ``started``); then ``more``."""
    return [ev("submitted", 1, job_id=job), *([ev("started", 2, attempt=1, job_id=job)] if started else []), *more]


def run(state: str, attempt: int = 0, node: str = "n3", job: str = PACK) -> JobRun:
    base, _, task = job.partition("_")
    active = JobState[state].is_active()
    return JobRun(
        job_id=job,
        raw_job_id=int(base) + attempt,
        base_job_id=int(base),
        array_task=int(task) if task else None,
        attempt=attempt,
        state=JobState[state],
        exit_status=0,
        exit_signal=0,
        node_list=node,
        partition="low",
        account="parcel",
        submit=100,
        start=None if state == "PENDING" else 101,
        end=None if active else 139,
        elapsed_s=0 if state == "PENDING" else 38,
        gpus=1,
        cpus=1,
        line=1 + attempt,
    )


def pack_after_node_failure() -> tuple[list[TrialRecord], dict[str, list[Event]]]:
    """One pack: t0000 completed in it, t0002 was training when its node went DOWN, t0004 waits its turn."""
    events = {
        "t0000": history("t0000", PACK, ev("ended", 3, attempt=1, how="completed", metric=0.4, step=82)),
        "t0002": history("t0002", PACK),
        "t0004": history("t0004", PACK, started=False),
    }
    return [fold(spec(t), e) for t, e in events.items()], events


def requeued(records: list[TrialRecord], runs: list[JobRun], job: str = PACK, restarts: int = 1, state: str = "PENDING") -> SchedulerFacts:
    """The facts right after the scheduler requeued ``job``: squeue lists it again, restart count ``restarts``."""
    return SchedulerFacts(queued={job: QueuedJob(job, state, "BeginTime", "", restarts)}, runs={job: runs}, turn_jobs=resolution.turn_jobs(records))


def test_resubmit_decides_on_the_record_as_its_resolution_will_leave_it():
    running = history("t0001", "7_0")
    node_failed = fold(spec("t0001"), running)
    done = fold(spec("t0002"), history("t0002", "7_1", ev("ended", 3, attempt=1, how="completed", metric=0.3, step=82)))
    facts = SchedulerFacts(runs={"7_0": [run("NODE_FAIL", job="7_0", node="n2")]})
    plan = decide([node_failed, done], {"t0001": running}, facts, dispatches={"t0001": 1}, policy=POLICY, now=9.0)
    assert [(r.trial_id, r.ending.how.value, r.ending.cause.value) for r in plan.resolve] == [("t0001", "interrupted", "node_fail")]
    assert [(r.trial_id, r.exclude_nodes) for r in plan.resubmit] == [("t0001", ("n2",))]
    assert "node_fail (NODE_FAIL)" in plan.resubmit[0].reason
    assert plan.untouched == (("t0002", "completed"),)
    # Still queued: nothing is resolved or resubmitted.
    alive = SchedulerFacts(queued={"7_0": QueuedJob("7_0", QueueState.RUNNING, "None", "n2")})
    assert decide([node_failed], {"t0001": running}, alive, dispatches={"t0001": 1}, policy=POLICY, now=9.0).resubmit == ()


@pytest.mark.parametrize(
    ("state", "how", "cause"),
    [
        ("BOOT_FAIL", "interrupted", "node_fail"),
        ("DEADLINE", "interrupted", "timeout"),
        ("OUT_OF_MEMORY", "failed", "out_of_memory"),
        ("FAILED", "lost", "lost"),
    ],
)
def test_a_vanished_attempt_ends_as_the_one_state_table_says(state, how, cause):
    record = fold(spec("t0001"), history("t0001", "7_0"))
    ended = resolution.ending_from_accounting(record, "7_0", [run(state, job="7_0")])
    assert (ended.how.value, ended.cause.value) == (how, cause)


def test_a_pack_requeued_after_a_node_failure_leaves_its_lost_trial_to_resubmit_at_once():
    records, events = pack_after_node_failure()
    facts = requeued(records, [run("NODE_FAIL"), run("PENDING", attempt=1, node="None assigned")])
    plan = decide(records, events, facts, dispatches={t: 1 for t in events}, policy=POLICY, now=200.0)
    # Lost (not interrupted): the requeued pack passes it by, so it gets a job of its own, away from n3.
    assert [(r.trial_id, r.ending.how, r.ending.cause) for r in plan.resolve] == [("t0002", AttemptEnd.LOST, Cause.NODE_FAIL)]
    assert "NODE_FAIL on n3" in plan.resolve[0].ending.message
    assert [(r.trial_id, r.exclude_nodes) for r in plan.resubmit] == [("t0002", ("n3",))]
    assert plan.resubmit[0].reason.startswith("node_fail (NODE_FAIL)")  # the run it ran in, not the pack's next one
    untouched = dict(plan.untouched)
    assert untouched["t0000"] == "completed" and untouched["t0004"] == f"job {PACK} is still queued or running"
    # status and sync see the same at once (sacct filed the NODE_FAIL run): the trial waits for a job of its own.
    (seen,) = resolution.resolve(records, facts, resolution.DEFINITE)
    after = fold(spec("t0002"), [*events["t0002"], preview(seen.attempt, seen.ending, 200.0)])
    assert after.state is TrialState.QUEUED and after.skipped_in_turn()
    assert not facts.runs_again(after) and facts.runs_again(records[2])  # the pack still runs t0004
    before = requeued(records, [run("RUNNING")], restarts=0, state="RUNNING")
    assert before.runs_again(records[1])  # while t0002 trains there, its pack runs it


def test_before_the_scheduler_requeues_the_pack_nothing_is_resolved():
    records, events = pack_after_node_failure()
    running = requeued(records, [run("RUNNING", node="n3")], restarts=0, state="RUNNING")
    plan = decide(records, events, running, dispatches={t: 1 for t in events}, policy=POLICY, now=200.0)
    assert plan.resolve == () and plan.resubmit == ()
    assert resolution.resolve(records, running, resolution.RESUBMIT) == []


def test_status_and_sync_wait_for_sacct_to_file_the_run_a_requeue_ended():
    records, _ = pack_after_node_failure()
    unfiled = requeued(records, [])  # squeue says requeued; sacct has no record of run 0 yet
    assert resolution.resolve(records, unfiled, resolution.DEFINITE) == []
    (guessed,) = resolution.resolve(records, unfiled, resolution.RESUBMIT)  # resubmit acts on squeue's word alone
    assert (guessed.ending.how, guessed.ending.cause) == (AttemptEnd.LOST, Cause.REQUEUED_BY_SCHEDULER)


def test_a_job_of_its_own_requeued_after_a_node_failure_reruns_its_trial():
    events = {"t0001": history("t0001", "6")}
    records = [fold(spec("t0001"), events["t0001"])]
    facts = requeued(records, [run("NODE_FAIL", job="6"), run("PENDING", attempt=1, job="6", node="None assigned")], job="6")
    plan = decide(records, events, facts, dispatches={"t0001": 1}, policy=POLICY, now=200.0)
    assert [(r.ending.how, r.ending.cause) for r in plan.resolve] == [(AttemptEnd.LOST, Cause.NODE_FAIL)]
    assert plan.resubmit == () and plan.untouched == (("t0001", "job 6 was requeued by the scheduler: its next run resumes the trial"),)


def test_a_gone_job_is_resolved_from_the_run_its_attempt_ran_in_not_the_jobs_last():
    """The pack was requeued after the NODE_FAIL and its next run completed the other trials: the
    lost trial's attempt ended NODE_FAIL on n3 (resubmit once called it ``lost (COMPLETED)``)."""
    records, events = pack_after_node_failure()
    gone = SchedulerFacts(runs={PACK: [run("NODE_FAIL"), run("COMPLETED", attempt=1, node="n2")]}, turn_jobs=resolution.turn_jobs(records))
    (res,) = resolution.resolve(records, gone, resolution.DEFINITE)
    assert (res.trial_id, res.ending.how, res.ending.cause) == ("t0002", AttemptEnd.INTERRUPTED, Cause.NODE_FAIL)
    assert "NODE_FAIL on n3" in res.ending.message and "COMPLETED" not in res.ending.message
    plan = decide(records, events, gone, dispatches={t: 1 for t in events}, policy=POLICY, now=200.0)
    assert plan.resubmit[0].reason.startswith("node_fail (NODE_FAIL)") and plan.resubmit[0].exclude_nodes == ("n3",)


def test_an_attempt_a_cancel_cut_off_is_interrupted_by_its_owner_never_failed():
    cancelled = ev("cancelled", 3, by="alice", reason="wrong space", whole_search=True)
    events = history("t0001", PACK, cancelled)
    record = fold(spec("t0001"), events)
    assert record.state is TrialState.CANCELLED and resolution.needs_resolution(record)  # left running by the old cancel
    gone = SchedulerFacts(runs={PACK: [run("CANCELLED")]})
    (res,) = resolution.resolve([record], gone, resolution.DEFINITE)  # what sync records
    assert (res.ending.how, res.ending.cause) == (AttemptEnd.INTERRUPTED, Cause.CANCELLED_BY_OWNER)
    after = fold(spec("t0001"), [*events, preview(res.attempt, res.ending, 4.0)])
    assert after.state is TrialState.CANCELLED and after.attempts[-1].how is AttemptEnd.INTERRUPTED
    assert not resolution.needs_resolution(after) and after.attempts[-1].interruption() is None  # spends no retry
    # The worker's own word in a pack that goes on: valid at birth, as only the owner's cancel is.
    assert Ended(AttemptEnd.INTERRUPTED, Cause.CANCELLED_BY_OWNER).cause is Cause.CANCELLED_BY_OWNER
    with pytest.raises(ValueError):
        Ended(AttemptEnd.LOST, Cause.CANCELLED_BY_OWNER)
    with pytest.raises(ValueError):
        Ended(AttemptEnd.INTERRUPTED, Cause.EXCEPTION)
    # A cancelled trial whose pack still runs its other trials is left to stop itself.
    still = SchedulerFacts(queued={PACK: QueuedJob(PACK, QueueState.RUNNING, "None", "n3")})
    assert resolution.resolve([record], still, resolution.DEFINITE) == []


def test_packs_and_slots_are_the_jobs_that_run_trials_in_turn():
    records, _ = pack_after_node_failure()
    alone = fold(spec("t0001"), history("t0001", "6"))
    assert resolution.turn_jobs([*records, alone], ["9", ""]) == frozenset({PACK, "9"})


def test_squeue_says_how_often_the_scheduler_requeued_a_job():
    jobs = parse_squeue("5_0|PENDING|1|BeginTime|\n5_1|RUNNING|0|None|n2\n")
    assert jobs == {"5_0": QueuedJob("5_0", QueueState.PENDING, "BeginTime", "", 1), "5_1": QueuedJob("5_1", QueueState.RUNNING, "None", "n2", 0)}
    with pytest.raises(SchedulerUnavailable):
        parse_squeue("5_0|PENDING|x|BeginTime|\n")


def test_a_cancelled_search_lists_its_launcher_as_cancelled():
    detached = {"L1": Heartbeat(900.0, "login", 7, LauncherState.DETACHED)}
    launches = [{"launch_id": "L1", "dispatched": ["t0000"]}]
    assert launcher_state(launches, detached, 1000.0, "login", lambda pid: False) is LauncherState.DETACHED
    assert launcher_state(launches, detached, 1000.0, "login", lambda pid: False, cancelled=True) is LauncherState.CANCELLED
    following = {"L2": Heartbeat(995.0, "login", 8, LauncherState.FOLLOWING)}
    assert launcher_state(launches, following, 1000.0, "login", lambda pid: True, cancelled=True) is LauncherState.FOLLOWING  # still stopping


def test_every_squeue_state_is_a_queue_state_and_an_unknown_word_is_one_line():
    # squeue lists a job while the controller holds it: every state word it may print means alive,
    # in one of the typed queue states (an ended run still listed is ENDING).
    assert {queue_state(s.text) for s in JobState} == set(QueueState)
    assert (queue_state("PENDING"), queue_state("REQUEUED"), queue_state("COMPLETING"), queue_state("BOOT_FAIL")) == (
        QueueState.PENDING,
        QueueState.REQUEUED,
        QueueState.ENDING,
        QueueState.ENDING,
    )
    with pytest.raises(SchedulerUnavailable, match="unknown job state 'WAITING'"):
        queue_state("WAITING")
