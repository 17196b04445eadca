"""A trial's shape (parcel_hpc.governance.shape, issue 50): a gang's worst case, reservation and
charge are every rank's, and a one-rank search's contract pins nothing new (its digest is kept)."""

import pytest

from parcel_hpc.budget import attempt_usage, launch_decision
from parcel_hpc.governance.shape import TrialShape

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
