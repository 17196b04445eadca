"""The follow loop against the fake dispatcher (``parcel_hpc.testing.dispatchers``): the launch's
promises about the scheduler, without a scheduler. The real dispatchers run the same paths in
tests/test_faults_local.py and tests/slurm/test_faults.py."""

from __future__ import annotations

import io
import json

import pytest
from hydra import compose, initialize_config_module
from rich.console import Console

from parcel_hpc.errors import SchedulerUnavailable
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.launch import follow
from parcel_hpc.launch.report import LaunchReport
from parcel_hpc.launch.search import SearchLaunch, from_hydra
from parcel_hpc.ledger import AttemptEnd, Cause, Ended, SearchDir, Started, TrialState
from parcel_hpc.lifecycle.actions import Action, Next
from parcel_hpc.lifecycle.resubmit import Resubmission
from parcel_hpc.propose.proposals import Proposer
from parcel_hpc.propose.specs import plan_template
from parcel_hpc.testing.dispatchers import FakeDispatcher
from parcel_hpc.worker import WorkerPlan

N = 6


def configured(tmp_path, artifacts, *overrides: str):
    with initialize_config_module("parcel_hpc.conf", version_base="1.3"):
        config = compose(
            "config",
            overrides=[
                f"search.root={tmp_path / 'runs'}",
                "search.revision=fake",
                f"search.n_trials={N}",
                f"snapshot.path={artifacts['snapshot_path']}",
                f"split.path={artifacts['split_path']}",
                *overrides,
            ],
            return_hydra_config=True,
        )
    return from_hydra(config, [])


def launch(cfg, dispatcher: FakeDispatcher, out: io.StringIO | None = None):
    """The real launch with the fake behind it; what it printed goes to ``out``."""
    out = io.StringIO() if out is None else out
    return SearchLaunch(cfg, lambda search: dispatcher, Console(file=out, width=200), poll_s=0.0).run(), out.getvalue()


def test_a_failed_submission_gives_back_the_dispatch_claims_of_what_never_reached_the_scheduler(tmp_path, artifacts):
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.pack_size=1")
    fake = FakeDispatcher(settings, slots=N)
    fake.fail_submit = (2, SchedulerUnavailable("sbatch: error: Batch job submission failed: Socket timed out"))
    with pytest.raises(SchedulerUnavailable, match="2 of the batch's 6 trials were submitted, the rest not and the search is resumable"):
        launch(cfg, fake)
    search = SearchDir(tmp_path / "runs" / "fake")
    trials = search.trial_ids()
    submitted = {s.trial_id for batch in fake.submitted for s in batch}
    withdrawn = {t for t in trials if (search.trial_dir(t) / "dispatch-1.withdrawn").exists()}
    assert len(submitted) == 2 and all(search.dispatch_count(t) == 1 for t in trials)
    assert withdrawn == set(trials) - submitted  # given back: no launcher waits on them
    again = FakeDispatcher(settings, slots=N)
    again.running = dict(fake.running)  # the two submitted jobs are still queued
    report, _ = launch(cfg, again)
    assert sorted(report.dispatched) == sorted(withdrawn)  # dispatched at once, the queued two left alone
    assert {t: search.dispatch_count(t) for t in trials} == {t: 2 if t in withdrawn else 1 for t in trials}


def test_held_arrays_an_earlier_launch_never_released_are_released_and_unknown_ones_left_alone(tmp_path, artifacts):
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.pack_size=1")
    first = FakeDispatcher(settings, slots=N)
    launch(cfg, first)
    search = SearchDir(tmp_path / "runs" / "fake")
    known = sorted({j for r in search.records() for j in r.jobs})
    # The launch died between submitting and releasing: its recorded jobs are held; one held array
    # the ledger does not know may be another launcher's, between its sbatch and its records.
    second = FakeDispatcher(settings, slots=N)
    second.held = {*known, "999"}
    _, printed = launch(cfg, second)
    assert second.released == known and second.held == {"999"} and second.cancelled == []
    assert f"released {len(known)} held arrays" in printed
    assert second.submitted == []  # their trials were already dispatched: nothing twice


def test_a_scheduler_that_stops_answering_is_waited_out_then_given_up_with_the_search_resumable(tmp_path, artifacts, monkeypatch):
    cfg, settings = configured(tmp_path, artifacts)
    fake = FakeDispatcher(settings, slots=N)
    clock = iter(range(0, 10_000, 400))  # each look at the clock is 400 s later
    monkeypatch.setattr(follow.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(follow.time, "sleep", lambda s: None)
    real_refresh = fake.refresh

    def refresh():
        if fake.submitted:  # the trials were submitted; then slurmctld went away for good
            fake.outage = SchedulerUnavailable("slurm_load_jobs error: Unable to contact slurm controller")
        real_refresh()

    fake.refresh = refresh
    printed = io.StringIO()
    with pytest.raises(SchedulerUnavailable, match=r"still no answer after 900s: trials already queued keep running, rerun the same launch"):
        launch(cfg, fake, printed)
    assert len({s.trial_id for batch in fake.submitted for s in batch}) == N  # dispatched before the outage, not again
    assert "the scheduler is not answering" in printed.getvalue()
    search = SearchDir(tmp_path / "runs" / "fake")
    assert all(search.dispatch_count(t) == 1 for t in search.trial_ids())


def test_a_resubmission_that_fails_gives_back_the_claims_of_every_group_not_submitted(tmp_path, artifacts):
    """Resubmit claims each trial's next dispatch, then submits group by group (one per set of nodes
    to avoid): a failure in the second group gives back its claims and the third group's."""
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.pack_size=1")
    launch(cfg, FakeDispatcher(settings, slots=N))
    search = SearchDir(tmp_path / "runs" / "fake")
    trials = search.trial_ids()
    groups = {trials[0]: ("n1",), trials[1]: ("n1",), trials[2]: ("n2",), trials[3]: ()}
    fake = FakeDispatcher(settings, slots=N)
    fake.fail_submit = (2, SchedulerUnavailable("sbatch: error: Socket timed out"))
    plans = {t: WorkerPlan.load(search, t) for t in groups}
    follower = follow.Follower(search, fake, plans, "resubmit-1", search.contract(), Console(file=io.StringIO()), 0.0, role="resubmit")
    with pytest.raises(
        SchedulerUnavailable, match="nothing of this batch was submitted and the search is resumable: fix that, then rerun `parcel-hpc resubmit`"
    ):
        follower.resubmit([Resubmission(t, "node_fail", nodes) for t, nodes in groups.items()], {t: 1 for t in groups})
    withdrawn = {t for t in trials if (search.trial_dir(t) / "dispatch-2.withdrawn").exists()}
    assert {s.trial_id for batch in fake.submitted for s in batch} == {trials[0], trials[1]}
    assert withdrawn == {trials[2], trials[3]} and all(search.dispatch_count(t) == 2 for t in groups)


def test_a_scheduler_that_fails_when_asked_for_capacity_gives_every_waiting_claim_back(tmp_path, artifacts, monkeypatch):
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.pack_size=1")
    fake = FakeDispatcher(settings, slots=N)

    def capacity():
        raise SchedulerUnavailable("scontrol: error: Unable to contact slurm controller")

    monkeypatch.setattr(fake, "capacity", capacity)
    with pytest.raises(SchedulerUnavailable, match="nothing of this batch was submitted"):
        launch(cfg, fake)
    search = SearchDir(tmp_path / "runs" / "fake")
    assert fake.submitted == [] and all((search.trial_dir(t) / "dispatch-1.withdrawn").exists() for t in search.trial_ids())


class DriftOnFirstJob(FakeDispatcher):
    """The first job's worker finds the image changed under the search: it rejects its attempt
    (drift) and the job ends; the second job is still pending, the rest wait for a slot."""

    def __init__(self, settings, search_path) -> None:
        super().__init__(settings, slots=2, capacity=2)
        self.search = SearchDir(search_path)

    def wait(self, seconds: float, at_least: float) -> None:
        first = self.submitted[0][0]
        if first.job_id in self.running:
            writer = self.search.writer(first.trial_id, "a1")
            writer.started(1, Started(job_id=first.job_id))
            writer.ended(1, Ended(AttemptEnd.REJECTED, Cause.DRIFT, outcome=Outcome.reject("image_digest"), reason="reject:image_digest: it differs"))
            self.finish(first.job_id)


def test_a_drift_rejection_stops_dispatching_cancels_what_has_not_started_and_gives_back_the_waiting_claims(tmp_path, artifacts):
    cfg, settings = configured(tmp_path, artifacts, "hydra.launcher.pack_size=1")
    fake = DriftOnFirstJob(settings, tmp_path / "runs" / "fake")
    with pytest.raises(GovernanceRefusal) as refused:
        launch(cfg, fake)
    assert str(refused.value.outcome) == "reject:image_digest"
    assert "relaunch the same command to run the 6 queued trials" in refused.value.detail
    search = SearchDir(tmp_path / "runs" / "fake")
    first, second = (batch[0] for batch in fake.submitted)
    assert len(fake.submitted) == 2 and fake.cancelled == [second.job_id]  # pending, never started: cancelled
    assert {r.state for r in search.records()} == {TrialState.QUEUED}  # nothing ran against anything
    waiting = set(search.trial_ids()) - {first.trial_id, second.trial_id}
    assert all((search.trial_dir(t) / "dispatch-1.withdrawn").exists() for t in waiting)  # a relaunch dispatches them at once


def test_a_job_another_launcher_recorded_after_the_schedulers_answer_is_waited_for_not_dispatched_again(tmp_path, artifacts, monkeypatch):
    """Two launchers starting together: the second's squeue answer predates the first's jobs, so it
    cannot say they are gone. Found in the 500-trial load test: both submitted the same trials."""
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.pack_size=1")
    first = FakeDispatcher(settings, slots=N)
    launch(cfg, first)
    search = SearchDir(tmp_path / "runs" / "fake")
    blind = FakeDispatcher(settings, slots=N)  # sees none of them: its answer came before they were recorded
    report, _ = launch(cfg, blind)
    assert blind.submitted == [] and report.dispatched == []
    assert all(search.dispatch_count(t) == 1 for t in search.trial_ids())
    monkeypatch.setattr(follow, "LOOK_MARGIN_S", -3600.0)  # the same answer, given an hour after they were recorded: they are gone
    report, _ = launch(cfg, FakeDispatcher(settings, slots=N))
    assert sorted(report.dispatched) == search.trial_ids()


def test_a_trial_a_slot_proposed_as_the_last_others_ended_keeps_the_launch_following(tmp_path, artifacts):
    """The round that adopts a slot's last proposals has already counted its trials: adopting them
    must keep the launch following, or it ends while they run (seen once on SLURM: running=2 at exit)."""
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "sampler=tpe", "search.n_trials=1", "hydra.launcher.dispatch=slots")
    fake = FakeDispatcher(settings, slots=2)
    report, _ = launch(cfg, fake)
    assert [s.slot for batch in fake.submitted for s in batch] == [f"{report.launch_id}-s0"]  # one proposal left: one slot
    search = SearchDir(tmp_path / "runs" / "fake")
    contract = search.contract()
    follower = follow.Follower(search, fake, {}, report.launch_id, contract, Console(file=io.StringIO()), 0.0)
    follower.slotting(follow.SlotPlan(plan_template(cfg, contract, search.path), 1, 0))
    follower.proposing(Proposer(search, contract, 1, report.launch_id), lambda spec: None, LaunchReport(search.path, report.launch_id, contract.digest))
    # What the slot does: propose the last trial, plan it, claim its dispatch, start it.
    made = Proposer(search, contract, 1, report.launch_id).propose(lambda: [])
    tid = made.spec.trial_id
    search.write_plan(tid, WorkerPlan.for_trial(plan_template(cfg, contract, search.path), made.spec).to_json())
    assert search.claim_dispatch(tid, report.launch_id, 0) == 1
    assert follower.proposer.remaining() == 0
    assert follower._propose() == 1 and tid in follower.plans  # adopted now: the launch follows it to its end
    assert follower._propose() == 0  # nothing more to adopt or propose: its trial is what keeps the launch going


def test_a_queued_dispatch_is_taken_by_the_launcher_before_its_replacement_is_claimed(tmp_path, artifacts):
    """A launcher that gives up a queued dispatch (its claimer's grace ran out) first takes it the way
    a slot would: a slot that took it a moment before keeps it, and no slot takes it afterwards."""
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.dispatch=slots")
    fake = FakeDispatcher(settings, slots=2)
    report, _ = launch(cfg, fake)
    search = SearchDir(tmp_path / "runs" / "fake")
    assert sorted(search.queued()) == [(t, 1) for t in sorted(search.trial_ids())]  # queued, no job yet
    assert search.take_dispatch("t0000", 1, "77_0", "a-slot")  # a slot takes t0000 and has not journaled yet
    later = follow.Follower(search, fake, {}, "another-launch", search.contract(), Console(file=io.StringIO()), 0.0)
    for tid in ("t0000", "t0001"):
        later.seen_dispatches[tid] = 1
        later._act(tid, Next(Action.DISPATCH))
    assert search.dispatch_count("t0000") == 1  # the slot's: never replaced under it
    assert search.dispatch_count("t0001") == 2 and ("t0001", 1) not in search.queued()  # taken back, then replaced
    assert json.loads((search.trial_dir("t0001") / "dispatch-1.taken").read_text())["slot"] == "launch another-launch"


def test_a_detached_slot_launch_makes_room_for_every_trial_at_its_limit(tmp_path, artifacts):
    cfg, settings = configured(tmp_path, artifacts, "search.wait=false", "hydra.launcher.dispatch=slots", "hydra.launcher.pack_size=1")
    fake = FakeDispatcher(settings, slots=2)
    _, printed = launch(cfg, fake)
    assert "detached: room for all 6 at their limit over the slots" in printed
    minutes = {json.loads(p.read_text())["minutes"] for p in (tmp_path / "runs" / "fake" / "slots").glob("*.json")}
    assert minutes == {(6 // 2 + 1) * int(settings.resources["time_limit_min"])}  # 3 each, and one more
