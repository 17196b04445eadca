"""A loop you own (issue 46): the run context every trainer's loop talks through, and exact resume
checked at the launch for every trainer form: a drifting trainer is refused in one line, exit 2,
before anything is frozen, naming where the runs part and the likely missing piece."""

import time
from collections.abc import Mapping

import numpy as np
import pytest

from parcel_hpc.checkpoints.cadence import Cadence
from parcel_hpc.errors import UsageError
from parcel_hpc.testing import launch
from parcel_hpc.trainer import Budget, Due, Param, Restored, Stop, StopTraining, TrainerState
from parcel_hpc.trainer import loop as trainer_loop
from parcel_hpc.trainer.data import Examples, TrainingData
from parcel_hpc.trainer.params import with_defaults
from parcel_hpc.trainer.preflight import few_examples, preflight
from parcel_hpc.trainer.resume import K, check_resume
from parcel_hpc.trainer.run import LoopError, Run

# --- the run protocol (pure) ---------------------------------------------------------------------


class Recorded(Run):
    """A run that keeps what it is told; ``signal_at``: the step at which the scheduler's flag is read."""

    def __init__(self, budget: Budget, signal_at: int = 0, prune_at: int = 0) -> None:
        empty = Examples.none((4, 4), 1)
        validation = Examples(empty.images[:0], empty.features, empty.labels, empty.damage_type, empty.camera_class, empty.shipment_id)
        data = TrainingData(empty, validation, None, "r1", budget=budget)  # type: ignore[arg-type]  # no preprocessing needed here
        super().__init__({}, 0, data, lambda scores: 0.5)
        self.signal_at, self.prune_at = signal_at, prune_at
        self.saves: list[int] = []
        self.validated: list[int] = []

    def _restore(self):
        return None

    def _stepped(self, step: int):
        return Stop.REQUEUE if step == self.signal_at else None

    def _save(self, step: int, state: TrainerState) -> None:
        self.saves.append(step)

    def _validated(self, step: int, value: float, final: bool, metrics: Mapping[str, float]):
        self.validated.append(step)
        return Stop.PRUNED if step == self.prune_at else None


def loop(run: Run) -> int:
    """The loop the docs show, with a state of one counter."""
    for step in range(1, run.budget.steps + 1):
        due = run.stepped(step, {"loss": 1.0 / step})
        if due.checkpoint:
            run.save(TrainerState({"w": np.array([step])}))
        if due.validate:
            run.validate(np.zeros(0))
        if run.should_stop:
            return step
    return run.budget.steps


def test_the_run_says_when_to_save_and_validate():
    run = Recorded(Budget(steps=10, milestones=(4,), cadence=Cadence(every_steps=3)))
    assert loop(run) == 10
    assert run.saves == [3, 6, 9, 10] and run.validated == [4, 10] and run.stop is None


def test_the_schedulers_flag_is_read_at_the_next_step_which_is_saved_before_the_loop_returns():
    run = Recorded(Budget(steps=10, milestones=(4,), cadence=Cadence(every_steps=3)), signal_at=5)
    assert loop(run) == 5
    assert run.saves == [3, 5] and run.validated == [4] and run.stop is Stop.REQUEUE


@pytest.mark.parametrize("prune_at", [0, 4])
def test_a_signal_read_at_a_milestone_saves_then_hands_the_milestone_which_may_still_prune(prune_at):
    """No milestone is lost to a requeue: the step the flag is read at is saved, its milestone scored
    and decided; a prune there ends the trial instead of the requeue."""
    run = Recorded(Budget(steps=10, milestones=(4,), cadence=Cadence(every_steps=3)), signal_at=4, prune_at=prune_at)
    assert loop(run) == 4
    assert run.saves == [3, 4] and run.validated == [4]
    assert run.stop is (Stop.PRUNED if prune_at else Stop.REQUEUE)


def test_a_signal_read_at_the_last_step_comes_with_the_result():
    run = Recorded(Budget(steps=10, milestones=(4,), cadence=Cadence(every_steps=3)), signal_at=10)
    assert loop(run) == 10 and run.validated == [4, 10] and run.stop is Stop.REQUEUE and run.done


def test_a_pruned_loop_returns_and_cannot_go_on():
    run = Recorded(Budget(steps=10, milestones=(4,), cadence=Cadence(every_steps=3)), prune_at=4)
    assert loop(run) == 4 and run.stop is Stop.PRUNED
    with pytest.raises(StopTraining):  # a BaseException: an ``except Exception`` in a loop does not swallow it
        run.stepped(5)


def test_a_loop_told_to_stop_without_saving_cannot_save():
    class Rejected(Recorded):
        def _stepped(self, step: int):
            return Stop.REJECTED if step == 3 else None

    run = Rejected(Budget(steps=10, cadence=Cadence(every_steps=3)))
    assert run.stepped(1) == Due(checkpoint=False, validate=False) and run.stepped(2) == Due(False, False)
    assert run.stepped(3) == Due(checkpoint=False, validate=False) and run.should_stop  # step 3 is on the cadence: no save after a rejection
    with pytest.raises(StopTraining):
        run.save(TrainerState({"w": np.zeros(1)}))


def test_steps_out_of_order_break_the_protocol():
    run = Recorded(Budget(steps=10))
    run.stepped(1)
    with pytest.raises(LoopError, match=r"run.stepped\(3\) after step 1"):
        run.stepped(3)


def test_a_librarys_checkpoint_directory_rides_in_the_state_and_comes_back_whole():
    run = Recorded(Budget(steps=10))
    run.stepped(1)
    with run.checkpoint_dir(TrainerState({"extra": np.arange(3)})) as d:
        (d / "last.ckpt").write_bytes(b"\x00lightning\xff")
        (d / "tokenizer").mkdir()
        (d / "tokenizer" / "vocab.json").write_text("{}")
    restored = Restored(1, run.last_saved)
    assert restored.has_files and list(run.last_saved.arrays["extra"]) == [0, 1, 2]
    with restored.files() as back:
        assert (back / "last.ckpt").read_bytes() == b"\x00lightning\xff" and (back / "tokenizer" / "vocab.json").read_text() == "{}"


# --- exact resume, checked at the launch ----------------------------------------------------------

TORCH_SPACE = ["~space.params.hidden", "~space.params.l2", "pruner=none"]


@pytest.mark.parametrize(
    "name, keys, likely",
    [
        ("Resumes", "", ""),
        ("LeavesOutScheduler", "torch/skeleton/optimizer/param_groups/0/lr, model/bias, model/weight", "the LR scheduler: the learning rate differs"),
        (
            "UnseededDataOrder",
            "model/bias, model/weight",
            "an unseeded generator: two uninterrupted runs with one seed already differ (a data-loader's shuffle",
        ),
        ("LibraryRNG", "model/bias, model/weight", "or a library RNG without a getter (LightGBM-style: it cannot be saved; declare train.resume_tolerance"),
    ],
)
def test_the_resume_check_names_where_a_resumed_run_parts_and_the_likely_missing_piece(small_data, name, keys, likely):
    torch_trainers = pytest.importorskip("parcel_hpc.testing.torch_trainers")
    cls = getattr(torch_trainers, name)
    found = check_resume(cls, with_defaults(cls.parameters, {"lr": 0.05}), 0, small_data)
    assert found.exact is (not likely) and (found.largest == 0.0) is found.exact and found.unread == ()
    if likely:
        assert found.detail.startswith("a resumed run parts from the uninterrupted one at step ") and "(largest difference " in found.detail
        assert f"state keys that differ at step {2 * K}: {keys}" in found.detail and likely in found.detail.partition("; likely: ")[2], found.detail


def _timed(run: Run) -> None:
    """A loop that resumes exactly but reports a metric of its own no two runs share (a step's time)."""
    w, start = 0.0, 0
    if (saved := run.restore()) is not None:
        w, start = float(saved.state.arrays["w"][0]), saved.step
    for step in range(start + 1, run.budget.steps + 1):
        w += float(run.params["lr"])
        due = run.stepped(step, {"seconds": time.perf_counter()})
        if due.checkpoint:
            run.save(TrainerState({"w": np.array([w])}))
        if due.validate:
            run.validate(np.full(len(run.data.validation), 1.0 / (1.0 + np.exp(-w))))
        if run.should_stop:
            return


def test_exact_resume_is_judged_on_the_validation_not_on_a_loops_own_metrics(small_data):
    timed = trainer_loop(parameters={"lr": Param(float)}, load=lambda state, params, seed, data: lambda images: np.zeros(len(images)))(_timed)
    found = check_resume(timed, {"lr": 0.1}, 0, small_data)
    assert found.exact and found.largest == 0.0, found.detail


@pytest.mark.parametrize(
    "name, likely",
    [
        ("LeavesOutScheduler", "the LR scheduler"),
        ("loop_leaves_out_scheduler", "the LR scheduler"),  # the function form: its own loop's save
        ("UnseededDataOrder", "an unseeded generator"),
        ("LibraryRNG", "a library RNG without a getter"),
    ],
)
def test_the_launch_s_preflight_refuses_each_drifting_trainer_in_one_line_naming_the_likely_missing_piece(small_data, name, likely):
    """What the launch runs before anything is frozen (``preflight``: its UsageError is the one line,
    exit 2; the scheduler-less one is launched for real below)."""
    torch_trainers = pytest.importorskip("parcel_hpc.testing.torch_trainers")
    cls = getattr(torch_trainers, name)
    target = f"parcel_hpc.testing.torch_trainers:{name}"
    with pytest.raises(UsageError) as refused:
        preflight(cls, target, cls.parameters, [("the space's low corner", {"lr": 0.05})], 0, small_data)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"preflight: {target} does not resume exactly with the space's low corner {{"), line
    assert likely in line.partition("; likely: ")[2] and line.endswith("a preempted trial would end with another metric than an uninterrupted one")


def test_a_library_rng_without_a_getter_passes_only_within_a_declared_tolerance(small_data):
    """Exact resume is impossible for it: a declared train.resume_tolerance above its drift admits it
    (its resumed trials then marked within_tolerance), one below is refused naming the tolerance."""
    torch_trainers = pytest.importorskip("parcel_hpc.testing.torch_trainers")
    cls, target, corner = torch_trainers.LibraryRNG, "parcel_hpc.testing.torch_trainers:LibraryRNG", [("the space's low corner", {"lr": 0.05})]
    drift = check_resume(cls, with_defaults(cls.parameters, {"lr": 0.05}), 0, small_data).largest
    assert drift > 0
    preflight(cls, target, cls.parameters, corner, 0, small_data, tolerance=drift * 2)
    with pytest.raises(UsageError, match=rf"does not resume exactly beyond train.resume_tolerance={drift / 2:g} "):
        preflight(cls, target, cls.parameters, corner, 0, small_data, tolerance=drift / 2)


def test_the_issues_trainer_without_its_scheduler_is_refused_at_the_launch(tmp_path, data_dir):
    pytest.importorskip("torch")
    target = "parcel_hpc.testing.torch_trainers:LeavesOutScheduler"
    res = launch([f"search.root={tmp_path / 'runs'}", "search.revision=drift", f"trainer.target={target}", *TORCH_SPACE], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stdout + res.stderr
    assert f"preflight: {target} does not resume exactly with the space's low corner" in res.stderr
    assert "likely: the LR scheduler" in res.stderr and "a preempted trial would end with another metric" in res.stderr
    assert not (tmp_path / "runs").exists()  # nothing frozen


def test_a_declared_parameter_the_trainer_never_reads_is_refused_at_the_launch(tmp_path, data_dir):
    target = "parcel_hpc.testing.trainers:DeclaresUnread"
    res = launch([f"search.root={tmp_path / 'runs'}", "search.revision=unread", f"trainer.target={target}", "pruner=none"], cwd=tmp_path, data_dir=data_dir)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"preflight: {target} declares momentum but never reads it" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.fixture(scope="module")
def small_data(training_data):
    return few_examples(training_data)
