"""A trial's shape (parcel_hpc.governance.shape, issue 50): a gang's worst case, reservation and
charge are every rank's, and a one-rank search's contract pins nothing new (its digest is kept).
Trials of several shapes in one search (``ShapePlan``: ``resources.shape_by`` names a choice
parameter whose value picks a trial's shape, the default for a value not listed): the plan, its
refusals, the contract's resources, the budget's worst case and each attempt's hold and charge.
tests/test_mixed_shapes_local.py runs such a search."""

from collections import Counter

import pytest

from parcel_hpc.budget import BudgetLedger, SearchBudget, attempt_usage, launch_decision
from parcel_hpc.errors import ParcelError, UsageError
from parcel_hpc.governance.shape import ShapePlan, TrialShape, value_key
from parcel_hpc.governance.validation import check_gang, check_mixed, check_shapes
from parcel_hpc.ledger import Executor
from parcel_hpc.propose.specs import pinned_resources
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.scheduler.slots import per_shape
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


BASE = {"gpus": 1, "cpus": 2, "mem_gb": 1.0, "time_limit_min": 60}
MIXED = {**BASE, "shape_by": "width", "shapes": {8: {"nodes": 2, "tasks_per_node": 2}, "16": {"tasks_per_node": 2}}}
SPACE = {"width": {"type": "choice", "values": [4, 8, 16]}, "lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True, "step": None}}


def test_a_trial_s_shape_is_its_parameter_s_and_the_default_for_a_value_not_listed():
    plan = ShapePlan.of(MIXED)
    one, four, two = TrialShape(1, 1, 1, 2), TrialShape(2, 2, 1, 2), TrialShape(1, 2, 1, 2)
    assert [plan.shape_of({"width": w, "lr": 0.1}) for w in (4, 8, 16)] == [one, four, two]
    assert plan.all_shapes() == (one, four, two) and plan.largest == four and plan.mixed
    # A trial's own resources: the contract's, its shape pinned as a gang's is (nothing for one rank).
    assert plan.trial_resources({"width": 4}) == BASE
    assert plan.trial_resources({"width": 8}) == {**BASE, "nodes": 2, "tasks_per_node": 2}
    assert TrialShape.of(plan.trial_resources({"width": 16})).gpus == 2  # every rank's GPUs
    # The key a config writes (8, or '16' quoted) and the value a trial draws compare as text.
    assert (value_key(8), value_key("16"), value_key(0.5), value_key(True)) == ("8", "16", "0.5", "true")
    flag = ShapePlan.of({**BASE, "shape_by": "wide", "shapes": {True: {"tasks_per_node": 2}}})  # a key as YAML reads `true`
    assert flag.shape_of({"wide": True}).ranks == 2 and flag.shape_of({"wide": False}).ranks == 1
    # A forged spec (another shape for its params), or a job of another world size, is not admitted.
    assert plan.admits({**BASE, "nodes": 2, "tasks_per_node": 2}, {"width": 8}, 4)
    assert not plan.admits(BASE, {"width": 8}, 1)
    assert not plan.admits({**BASE, "nodes": 2, "tasks_per_node": 2}, {"width": 8}, 2)
    assert not plan.admits({**BASE, "tasks_per_node": 2}, {"width": 4}, 2)


def test_without_a_mapping_the_contract_pins_nothing_new_and_each_trial_takes_the_contract_s_resources():
    config = {**BASE, "nodes": 1, "tasks_per_node": 1, "shape_by": None, "shapes": None, "partition": None}
    assert pinned_resources(config) == BASE  # the digest of every search frozen before shapes per trial
    gang = {**config, "tasks_per_node": 2}
    assert pinned_resources(gang) == {**BASE, "nodes": 1, "tasks_per_node": 2}
    plan = ShapePlan.of(pinned_resources(gang))
    assert not plan.mixed and plan.pinned() == {} and plan.trial_resources({"width": 4}) == pinned_resources(gang)
    mixed = pinned_resources({**config, "shape_by": "width", "shapes": {8: {"nodes": 2, "tasks_per_node": 2}}})
    assert mixed == {**BASE, "shape_by": "width", "shapes": {"8": {"nodes": 2, "tasks_per_node": 2}}}
    assert ShapePlan.of(mixed).shape_of({"width": 8}).ranks == 4  # read back from the frozen contract


@pytest.mark.parametrize(
    ("resources", "needle"),
    [
        (
            {"shape_by": "depth", "shapes": {8: {"tasks_per_node": 2}}},
            "resources.shape_by='depth' is not a searched parameter; name one of the space's choice parameters ['width']",
        ),
        ({"shape_by": "lr", "shapes": {8: {"tasks_per_node": 2}}}, "resources.shape_by='lr' is not a choice parameter"),
        ({"shapes": {8: {"tasks_per_node": 2}}}, "is given without resources.shape_by"),
        ({"shape_by": "width"}, "maps no value of width to a shape"),
        (
            {"shape_by": "width", "shapes": {5: {"tasks_per_node": 2}}},
            "resources.shapes.5={'tasks_per_node': 2} is keyed by a value width does not take; key shapes by width's values ['4', '8', '16']",
        ),
        ({"shape_by": "width", "shapes": {8: {"tasks_per_node": 0}}}, "resources.shapes.8.tasks_per_node=0 is not a positive whole number"),
        ({"shape_by": "width", "shapes": {8: {"nodes": "two"}}}, "resources.shapes.8.nodes='two' is not a positive whole number"),
        ({"shape_by": "width", "shapes": {8: {"ranks": 2}}}, "resources.shapes.8={'ranks': 2} is not a shape; give {nodes: N, tasks_per_node: T}"),
        ({"shape_by": "width", "shapes": {8: 2}}, "resources.shapes.8=2 is not a shape"),
        ({"shape_by": "width", "shapes": {8: {"nodes": 2}, "8": {"nodes": 1}}}, "names one value of width twice; key each value once"),
    ],
)
def test_a_bad_mapping_is_one_line_naming_the_fix(resources, needle):
    with pytest.raises(UsageError) as refused:
        check_shapes({**BASE, "shapes": None, **resources}, SPACE)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_slots_of_several_shapes_take_a_fixed_list_while_the_launch_follows_them():
    mixed, one = ShapePlan.of(MIXED), ShapePlan.of(BASE)
    refused = [
        ({"dispatch": "slots"}, True, True, "with a sampler that learns proposes into slots"),
        ({"dispatch": "auto"}, True, True, "with a sampler that learns proposes into slots"),
        ({"dispatch": "slots"}, False, False, "with search.wait=false; set hydra.launcher.dispatch=jobs"),
    ]
    for launcher, learns, waits, needle in refused:
        with pytest.raises(UsageError, match=needle):
            check_mixed(mixed, launcher, learns, waits)
        check_mixed(one, launcher, learns, waits)  # one shape: slots of it, as before
    check_mixed(mixed, {"dispatch": "slots"}, False, True)  # a fixed list: slots of each shape
    check_mixed(mixed, {"dispatch": "jobs"}, True, True)  # a learning sampler's proposals, each a job of its own shape
    check_mixed(mixed, {"dispatch": "auto"}, False, False)  # a fixed list in jobs, detached


def test_fresh_slots_of_several_shapes_share_the_room_in_turn():
    a, b, c = TrialShape(1, 1), TrialShape(1, 2), TrialShape(2, 2)
    assert per_shape({a: 5, b: 1}, {}, 2) == {a: 1, b: 1}  # one each first: b is not starved by a's many
    assert per_shape({a: 5, b: 1}, {}, 4) == {a: 3, b: 1}
    assert per_shape({a: 5, b: 1}, {b: 1}, 4) == {a: 4}  # b's one trial has its live slot
    assert per_shape({a: 1, c: 2}, {a: 3}, 1) == {c: 1} and per_shape({a: 2}, {}, 0) == {}


def test_the_worst_case_is_each_known_trial_s_own_shape_and_the_largest_for_trials_not_known_yet():
    contract = {"budget": BUDGET, "resources": pinned_resources({**MIXED, "nodes": 1, "tasks_per_node": 1})}
    plan = ShapePlan.of(contract["resources"])
    one, four = plan.shape_of({"width": 4}), plan.shape_of({"width": 8})
    # 6 trials of one rank and 4 of 4 ranks, 2 attempts each, an hour: 6x2x1 + 4x2x4 GPU-h.
    known = launch_decision(contract, 10, 0, None, Counter({one: 6, four: 4})).commitment
    assert (known.gpu_hours, known.cpu_hours, known.trials, known.attempts) == pytest.approx((44.0, 88.0, 10, 20))
    assert (known.gpus, known.cpus, known.shapes) == (4, 8, 2)  # an attempt holds up to the largest's
    # 3 of them known, 7 a learning sampler has yet to propose: those at the largest shape.
    ahead = launch_decision(contract, 10, 0, None, Counter({one: 3})).commitment
    assert ahead.gpu_hours == pytest.approx(3 * 2 * 1 + 7 * 2 * 4)
    assert launch_decision(contract, 10, 0, None).commitment.gpu_hours == pytest.approx(80.0)  # none known: all the largest
    with pytest.raises(ParcelError, match="3 trials of known shapes among 2"):
        launch_decision(contract, 2, 0, None, Counter({one: 3}))  # a caller's miscount is never a smaller worst case
    # One shape: the same figure as before shapes per trial.
    assert launch_decision({"budget": BUDGET, "resources": BASE}, 10, 0, None, Counter({TrialShape.of(BASE): 10})).commitment.gpu_hours == 20.0


def test_each_attempt_holds_and_is_charged_its_own_trial_s_shape(tmp_path):
    contract = {"budget": BUDGET, "resources": pinned_resources({**MIXED, "nodes": 1, "tasks_per_node": 1})}
    plan = ShapePlan.of(contract["resources"])
    small, gang = plan.trial_resources({"width": 4}), plan.trial_resources({"width": 8})
    budget = SearchBudget(tmp_path, contract)
    assert budget.reserve("t0000", 1, small).ok and budget.reserve("t0001", 1, gang).ok
    budget.settle("t0000", 1, small, 0.0, 1800.0)
    budget.settle("t0001", 1, gang, 0.0, 1800.0)
    holds = BudgetLedger.read(tmp_path).holds
    reserved = {k.trial_id: (h.reserved_gpu_hours, h.reserved_cpu_hours) for k, h in holds.items()}
    used = {k.trial_id: (h.used_gpu_hours, h.used_cpu_hours) for k, h in holds.items()}
    assert reserved == {"t0000": (1.0, 2.0), "t0001": (4.0, 8.0)}  # its GPUs and CPUs for its whole limit
    assert used == {"t0000": (0.5, 1.0), "t0001": (2.0, 4.0)}  # ranks x GPUs per rank x hours
    assert attempt_usage(gang, 0.0, 1800.0) == (2.0, 4.0)
