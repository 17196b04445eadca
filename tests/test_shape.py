"""A trial's shape (parcel_hpc.governance.shape, issue 50): a gang's worst case, reservation and
charge are every rank's, and a one-rank search's contract pins nothing new (its digest is kept)."""

import pytest

from parcel_hpc.budget import attempt_usage, launch_decision
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.governance.validation import check_gang
from parcel_hpc.ledger import Executor
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.worker.gang import GangEnv

BUDGET = {"max_trials": 100, "gpu_hours_cap": 1000.0, "cost_cap": 10000.0, "rate_per_gpu_hour": 2.0, "rate_per_cpu_hour": 0.1, "max_retries": 1}


def test_a_gang_holds_every_ranks_gpus_and_cpus_and_one_rank_pins_nothing_new():
    gang = TrialShape.of({"nodes": 2, "tasks_per_node": 4, "gpus": 1, "cpus": 6})
    assert (gang.ranks, gang.gpus, gang.cpus, gang.is_gang) == (8, 8, 48, True)
    assert gang.pinned() == {"nodes": 2, "tasks_per_node": 4} and gang.describe() == "2 nodes x 4 ranks x 1 GPU"
    one = TrialShape.of({"gpus": 1, "cpus": 2})  # a contract frozen before gangs names neither
    assert (one.ranks, one.gpus, one.cpus, one.pinned(), one.describe()) == (1, 1, 2, {}, "1 GPU")
    assert TrialShape.of({"nodes": 1, "tasks_per_node": 1, "gpus": 1, "cpus": 2}) == one


def test_the_worst_case_and_the_charge_of_a_gang_are_every_ranks():
    resources = {"gpus": 1, "cpus": 2, "time_limit_min": 60, "nodes": 2, "tasks_per_node": 2}
    decision = launch_decision({"budget": BUDGET, "resources": resources}, 10, 0, None)
    # 10 trials x 2 attempts x 4 ranks x 1 GPU x 1 h
    assert decision.commitment.gpu_hours == pytest.approx(80.0) and decision.commitment.cpu_hours == pytest.approx(160.0)
    one = launch_decision({"budget": BUDGET, "resources": {**resources, "nodes": 1, "tasks_per_node": 1}}, 10, 0, None)
    assert one.commitment.gpu_hours == pytest.approx(20.0)
    # Half an hour of a gang the scheduler allocated 4 GPUs: 2 GPU-h, 4 CPU-h.
    assert attempt_usage(resources, 0.0, 1800.0, gpus=4) == pytest.approx((2.0, 4.0))
    assert attempt_usage(resources, 0.0, 1800.0) == pytest.approx((2.0, 4.0))  # the request, as reserved


def test_a_gang_runs_only_where_its_ranks_start_together_in_a_job_of_its_own():
    local, slurm = backend_of(Executor("local")), backend_of(Executor("slurm"))
    two = TrialShape.of({"nodes": 1, "tasks_per_node": 2, "gpus": 0, "cpus": 1})
    spread = TrialShape.of({"nodes": 2, "tasks_per_node": 2, "gpus": 0, "cpus": 1})
    one = TrialShape.of({"gpus": 0, "cpus": 1})
    jobs = {"pack_size": "auto", "dispatch": "auto"}
    check_gang(two, jobs, 1, local.gang_refusal(two))  # one machine's ranks: run
    check_gang(spread, jobs, 1, slurm.gang_refusal(spread))  # srun starts a job's tasks on its nodes
    check_gang(one, {"pack_size": 4, "dispatch": "slots"}, 5, slurm.gang_refusal(one))  # one rank: nothing to check
    refusals = [
        (
            spread,
            jobs,
            1,
            local,
            "resources.nodes=2 asks for a trial of 4 ranks (2 nodes x 2 ranks x 0 GPU); the local executor runs a trial on this one machine",
        ),
        (two, jobs, 4, local, "with a split of 4 folds"),
        (two, {"pack_size": 3}, 1, local, "hydra.launcher.pack_size=3 packs trials of 2 ranks; a gang is its own job"),
    ]
    check_gang(two, {"dispatch": "slots"}, 1, local.gang_refusal(two))  # slots shaped like the gang
    for shape, launcher, folds, backend, needle in refusals:
        with pytest.raises(UsageError) as refused:
            check_gang(shape, launcher, folds, backend.gang_refusal(shape))
        assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_each_rank_of_a_node_gets_its_share_of_the_gpus_the_node_was_handed():
    rank = GangEnv.of_job("4711", 3, 4, 1, 2, ["n1", "n2"])
    assert rank.devices("0,1,2,3", 2) == "2,3" and rank.devices("5,6", 1) == "6"
    assert rank.devices("2", 1) is None and rank.devices("", 0) is None  # already one rank's (--gpus-per-task), or none
    env = rank.environ()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("3", "4", "1", "n1")
    assert GangEnv.of_job("4711", 0, 4, 0, 2, ["n1", "n2"]).master_port == int(env["MASTER_PORT"])  # every rank, every requeue: one port


def test_a_gang_s_run_is_split_over_its_nodes_and_ranks_as_srun_lays_them_out_and_adds_up():
    from parcel_hpc.accounting.ranks import node_hours, rank_lines
    from parcel_hpc.accounting.reconcile import AttemptLine, Waste
    from parcel_hpc.scheduler.slurm.queue import node_names

    assert node_names("n[1-3,5],gpu[01-02],login") == ["n1", "n2", "n3", "n5", "gpu01", "gpu02", "login"]
    assert node_names("None assigned") == ["None assigned"] and node_names("n[a-b]") == ["n[a-b]"]
    shape = TrialShape.of({"nodes": 2, "tasks_per_node": 3, "gpus": 1, "cpus": 2})
    line = AttemptLine("t1", "41", 0, "COMPLETED", "n[3-4]", 0, 0, 3600, 3600, 6, 12, 6.0, 12.0, 0.0, 0, 1, "completed", Waste.USEFUL)
    ranks = rank_lines([line, AttemptLine("", "42", 0, "COMPLETED", "n1", 0, 0, 1, 1, 6, 12, 1.0, 1.0, 0.0, 0, None, "", Waste.USEFUL)], shape, node_names)
    assert [(r.rank, r.node, r.gpus, r.cpus) for r in ranks] == [
        (0, "n3", 1, 2),
        (1, "n3", 1, 2),
        (2, "n3", 1, 2),
        (3, "n4", 1, 2),
        (4, "n4", 1, 2),
        (5, "n4", 1, 2),
    ]
    assert sum(r.gpu_hours for r in ranks) == pytest.approx(6.0) and sum(r.cpu_hours for r in ranks) == pytest.approx(12.0)  # the orphan's none
    assert node_hours(ranks) == {("t1", "41", 0, "n3"): pytest.approx((3.0, 6.0)), ("t1", "41", 0, "n4"): pytest.approx((3.0, 6.0))}
    assert rank_lines([line], TrialShape.of({"gpus": 1, "cpus": 2}), node_names) == ()  # one rank: nothing to split
    assert all(r.gpu_hours_used is None and r.gpu_hours_idle is None for r in ranks)  # no reading handed in: unread, never idle


def test_each_rank_s_gpu_use_is_its_own_reading_and_a_rank_that_told_none_is_unread():
    from parcel_hpc.accounting.ranks import rank_lines
    from parcel_hpc.accounting.reconcile import AttemptLine, Waste
    from parcel_hpc.accounting.spend import GpuUse
    from parcel_hpc.ledger import DeviceUse, Event, EventKind

    rank0, rank2 = DeviceUse(("H100",), 10, 0.5, 4, {"torch": "2.9"}), DeviceUse(("H100",), 30, 0.25, 2)
    use = DeviceUse.of_gang([rank0, None, rank2], 1)  # rank 1 told nothing (its process gone)
    assert use.devices == ("H100", "unknown", "H100") and use.peak_memory_bytes == 30 and use.frameworks == {"torch": "2.9"}
    assert use.rank_utilization == (0.5, None, 0.25) and use.rank_samples == (4, 0, 2) and use.samples == 6
    assert use.utilization == pytest.approx((0.5 * 4 + 0.25 * 2) / 6, abs=1e-4)  # every reading's mean
    assert use.of_rank(1) == DeviceUse(("unknown",)) and use.of_rank(2) == DeviceUse(("H100",), None, 0.25, 2) and use.of_rank(3) is None
    event = Event(EventKind.DEVICE_USE, 1.0, "w", 0, 1, use)
    assert Event.from_json(event.to_json()) == event  # journaled and read back, None included
    # The spend: each rank's third of 3 GPU-hours at its own reading; rank 1's hour unread, not its peers' mean.
    assert GpuUse.of(3.0, use) == GpuUse(3.0, 0.5 + 0.25, 1.0)
    with pytest.raises(ValueError, match="mean of its samples"):
        DeviceUse(("H100",) * 2, utilization=0.5, samples=2, rank_utilization=(0.5, None), rank_samples=(1, 1))
    assert DeviceUse.of_gang([DeviceUse(("cpu",)), DeviceUse(("cpu",))], 0) == DeviceUse(("cpu",))  # no GPU: nothing per rank

    shape = TrialShape.of({"nodes": 1, "tasks_per_node": 3, "gpus": 1})
    line = AttemptLine("t1", "41", 0, "COMPLETED", "n1", 0, 0, 3600, 3600, 3, 3, 3.0, 3.0, 0.0, 0, 1, "completed", Waste.USEFUL)
    ranks = rank_lines([line], shape, lambda nodes: [nodes], {("t1", 1): use})
    assert [(r.device, r.gpu_utilization, r.gpu_hours_used, r.gpu_hours_idle) for r in ranks] == [
        ("H100", 0.5, 0.5, 0.5),
        ("unknown", None, None, None),
        ("H100", 0.25, 0.25, 0.75),
    ]
