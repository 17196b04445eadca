"""Accounts, with plain values: SLURM association limits read from recorded sacctmgr/sshare text,
the launch's worst case admitted against them, and the account-wide totals of many searches."""

from dataclasses import replace

import pytest

from parcel_hpc.accounting.account import NO_SEARCH, SearchPart, over_account, over_searches
from parcel_hpc.accounting.reconcile import AttemptLine, Reconciliation
from parcel_hpc.accounting.spend import GpuUse, search_spend
from parcel_hpc.budget import AssociationLimit, LimitKind, Rates, admit_account, render_account, worst_case
from parcel_hpc.errors import SchedulerUnavailable
from parcel_hpc.governance.outcome import GovernanceRefusal
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slurm.queue import association_chain, limits_of, parse_associations, parse_shares, parse_tres
from parcel_hpc.scheduler.states import JobState

# Recorded on the dev cluster (SLURM 22.05): `sacctmgr -nP show associations format=...` and
# `sshare -nP -a --format=...`, after `sacctmgr modify account tight set GrpTRESMins=gres/gpu=600`
# and user limits (one on partition high only); sshare indents accounts by their depth.
ASSOCIATIONS = """parcel|root|||||
parcel|root|root||||
parcel|lab|||root|cpu=100000|
parcel|tight|||lab|gres/gpu=600|gres/gpu=120
parcel|tight|ana||||
parcel|tight|root||||cpu=50
parcel|tight|root|high|||cpu=10
other|tight|||root|gres/gpu=1|
"""
SHARES = """root||cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0|cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0
 lab||cpu=500,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=100|cpu=0,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=0
  tight||cpu=400,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=90|cpu=20,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=30
  tight|root|cpu=400,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=90|cpu=20,mem=0,energy=0,node=0,billing=0,fs/disk=0,vmem=0,pages=0,gres/gpu=30
"""


def test_tres_lists_parse_and_garbage_is_refused():
    assert parse_tres("cpu=10,gres/gpu=600") == {"cpu": 10.0, "gres/gpu": 600.0}
    assert parse_tres("") == {}
    with pytest.raises(SchedulerUnavailable, match="unexpected TRES value"):
        parse_tres("gres/gpu=lots")
    with pytest.raises(SchedulerUnavailable, match="sacctmgr printed an unexpected line"):
        parse_associations("parcel|tight", "parcel")


def test_the_limits_a_job_counts_against_are_its_users_its_accounts_and_every_parent_up_to_the_root():
    assocs = parse_associations(ASSOCIATIONS, "parcel")
    assert assocs[("tight", "")].grp_tres_mins == {"gres/gpu": 600.0}  # this cluster's, not the other cluster's 1
    limits = limits_of(association_chain("tight", "root", assocs), parse_shares(SHARES))
    as_tuples = [(lim.association, lim.kind, lim.tres, lim.limit_min, lim.used_min, lim.running_min) for lim in limits]
    assert as_tuples == [
        ("user root in account tight", LimitKind.GRP_TRES_RUN_MINS, "cpu", 50.0, 0.0, 20.0),
        ("account tight", LimitKind.GRP_TRES_MINS, "gres/gpu", 600.0, 90.0, 30.0),
        ("account tight", LimitKind.GRP_TRES_RUN_MINS, "gres/gpu", 120.0, 0.0, 30.0),
        ("account lab", LimitKind.GRP_TRES_MINS, "cpu", 100000.0, 500.0, 0.0),
    ]
    assert limits_of(association_chain("root", "root", assocs), {}) == []  # no limit anywhere on that chain
    assert all("other" not in lim.association for lim in limits)  # another cluster's associations never apply


def test_a_partitions_own_association_wins_on_that_partition_and_applies_nowhere_else():
    on_high = parse_associations(ASSOCIATIONS, "parcel", partition="high")
    assert on_high[("tight", "root")].grp_tres_run_mins == {"cpu": 10.0}
    on_low = parse_associations(ASSOCIATIONS, "parcel", partition="low")
    assert on_low[("tight", "root")].grp_tres_run_mins == {"cpu": 50.0}


def test_a_limit_whose_usage_is_hidden_is_an_error_never_read_as_unused():
    assocs = parse_associations(ASSOCIATIONS, "parcel")
    shares = parse_shares(SHARES)
    hidden = {k: v for k, v in shares.items() if k != ("tight", "")}  # PrivateData=usage hides the account's row
    with pytest.raises(SchedulerUnavailable, match="sshare shows no usage for account tight, which limits gres/gpu"):
        limits_of(association_chain("tight", "root", assocs), hidden)


def test_a_typed_gpu_limit_counts_the_jobs_gpus():
    typed = parse_associations("parcel|gpus|||root|gres/gpu:a100=50|\n", "parcel")
    shares = {("gpus", ""): ({"gres/gpu:a100": 10.0}, {})}
    limits = limits_of(association_chain("gpus", "root", typed), shares)
    assert [(lim.tres, lim.limit_min, lim.used_min) for lim in limits] == [("gres/gpu:a100", 50.0, 10.0)]
    held = admit_account(commitment(trials=1, gpus=2, minutes=30.0, retries=0), limits, "gpus")
    assert not held.ok and "needs 60" in held.message  # 2 GPUs x 30 min > 50 - 10


def commitment(trials=10, gpus=1, cpus=2, minutes=20.0, retries=1):
    return worst_case(trials, gpus, cpus, minutes, retries, Rates(1.0))


def test_a_worst_case_beyond_what_the_account_may_still_use_is_held_naming_the_limit():
    # 10 trials x 2 attempts x 1 GPU x 20 min = 400 GPU-min; 600 - 90 used - 30 running leaves 480.
    fits = AssociationLimit("account tight", LimitKind.GRP_TRES_MINS, "gres/gpu", 600, used_min=90, running_min=30)
    assert admit_account(commitment(), [fits], "tight").ok
    tighter = AssociationLimit("account tight", LimitKind.GRP_TRES_MINS, "gres/gpu", 500, used_min=90, running_min=30)
    held = admit_account(commitment(), [tighter], "tight")
    assert not held.ok and str(held.outcome) == "hold:budget"
    assert held.message.startswith("account tight GrpTRESMins gres/gpu=500: 90 GPU-min used and 30 held by running jobs leave 380")
    assert "needs 400 (10 trials x 2 attempts x 1 x 20 min)" in held.message and "lower search.n_trials" in held.message
    with pytest.raises(GovernanceRefusal) as refusal:
        held.require()
    assert str(refusal.value.outcome) == "hold:budget"
    assert "OVER by 20" in render_account(held, "tight")


def test_a_run_minutes_limit_smaller_than_one_job_holds_the_launch():
    one_job = AssociationLimit("account tight", LimitKind.GRP_TRES_RUN_MINS, "gres/gpu", 15, running_min=0)
    held = admit_account(commitment(), [one_job], "tight")
    assert not held.ok and "one job holds 20 GPU-min when it starts" in held.message and "wait in the queue forever" in held.message
    busy_but_fits = AssociationLimit("account tight", LimitKind.GRP_TRES_RUN_MINS, "gres/gpu", 25, running_min=24)
    assert admit_account(commitment(), [busy_but_fits], "tight").ok  # it waits for the running ones, then starts
    cpu_only = AssociationLimit("account tight", LimitKind.GRP_TRES_MINS, "gres/gpu", 1)
    assert admit_account(commitment(gpus=0), [cpu_only], "tight").ok  # a CPU search asks no GPU-minutes
    none = admit_account(commitment(), [], "tight")
    assert none.ok and "has no GrpTRESMins or GrpTRESRunMins" in render_account(none, "tight")


def line(job, hours, user="", partition="low", trial="t0"):
    return AttemptLine(trial, job, 0, "COMPLETED", "n1", 0, 0, 3600, 3600, 1, 1, hours, hours, hours * 2, 0, 1, "completed", "", partition, user)


def rec(campaign, lines, cap=10.0):
    scheduler = {"gpu_hours": {"used": sum(l.gpu_hours for l in lines), "cap": cap, "left": 0.0}, "cost": {"used": 0.0, "cap": 100.0, "left": 0.0}}
    return Reconciliation(campaign, "miss-cost-r3", "sacct", tuple(lines), (), (), {}, {}, scheduler, search_spend([], None, [], Rates(2.0)))


def run(job, hours, user, partition="low", account="parcel"):
    return JobRun(
        job,
        int(job.split("_")[0]),
        int(job.split("_")[0]),
        None,
        0,
        JobState.COMPLETED,
        0,
        0,
        "n1",
        partition,
        account,
        0,
        0,
        3600,
        3600,
        int(hours),
        int(hours),
        1,
        user,
    )


def test_totals_over_searches_by_user_search_and_partition():
    a = SearchPart("/r/ana/a-r1", "ana", rec("a-r1", [line("10", 1.0, "ana"), line("11", 2.0, "ana", "high")]))
    b = SearchPart("/r/bo/b-r1", "bo", rec("b-r1", [line("20", 4.0, "")]))  # a local run: the search's launcher is its user
    report = over_searches("root /r", [a, b])
    assert [(t.key, t.gpu_hours) for t in report.by_user] == [("bo", 4.0), ("ana", 3.0)]
    assert [(t.key, t.gpu_hours) for t in report.by_search] == [("/r/bo/b-r1", 4.0), ("/r/ana/a-r1", 3.0)]
    assert {t.key: t.gpu_hours for t in report.by_partition} == {"low": 5.0, "high": 2.0}
    assert report.totals()["gpu_hours"] == 7.0 and report.unknown.num_rows == 0


def test_totals_split_gpu_hours_into_used_and_idle_and_count_those_without_a_reading_apart():
    read = replace(line("10", 1.0, "ana"), device="NVIDIA H200", gpu_utilization=0.25, gpu_hours_used=0.25, gpu_hours_idle=0.75)
    unread = line("11", 2.0, "ana")  # its worker read no utilization: neither used nor idle
    report = over_searches("root /r", [SearchPart("/r/ana/a-r1", "ana", rec("a-r1", [read, unread]))])
    (ana,) = report.by_user
    assert ana.gpu_use == GpuUse(3.0, 0.25, 2.0) and ana.gpu_use.idle == pytest.approx(0.75)
    assert ana.to_json()["gpu_use"] == report.totals()["gpu_use"] == {"allocated": 3.0, "used": 0.25, "idle": 0.75, "unread": 2.0}


def test_an_account_report_attributes_known_jobs_to_their_search_and_lists_the_rest():
    a = SearchPart("/r/ana/a-r1", "ana", rec("a-r1", [line("10", 1.0, "ana")]))
    runs = [run("10", 1, "ana"), run("30", 5, "carl", "high"), run("31", 2, "ana")]
    report = over_account("account parcel since 2026-11-01", [a], runs, {"/r/ana/a-r1": Rates(3.0)})
    assert report.unknown.column("job_id").to_pylist() == ["30", "31"] and set(report.unknown.column("search").to_pylist()) == {NO_SEARCH}
    assert report.unknown.column("cost").null_count == 2  # no search prices them
    assert {t.key: t.gpu_hours for t in report.by_user} == {"carl": 5.0, "ana": 3.0}
    assert [(t.key, t.jobs, t.gpu_hours) for t in report.by_account] == [("parcel", 3, 8.0)]
    known = next(t for t in report.by_search if t.key == "/r/ana/a-r1")
    assert known.gpu_hours == 1.0 and known.cost == pytest.approx(3.0)  # priced at its own search's rates
    assert report.totals()["unknown_gpu_hours"] == 7.0


def test_a_packed_job_holds_its_whole_pack_against_a_run_minutes_limit():
    run_limit = [AssociationLimit("account tight", LimitKind.GRP_TRES_RUN_MINS, "gres/gpu", 100)]
    assert admit_account(commitment(minutes=20.0), run_limit, "tight").ok  # one trial a job: 20 GPU-min
    packed = admit_account(commitment(minutes=20.0), run_limit, "tight", job_minutes=120.0)  # six a job
    assert not packed.ok and "one job holds 120 GPU-min" in packed.message and "hydra.launcher.pack_size" in packed.message
