"""The checkpoint cadence (issue 49): steps or seconds of training, the one decision every trainer
form's saves go through, and the launch's rule for it (one of the two, never both; the default from
the launcher's signal delay)."""

import copy

import pytest
from test_validation import CFG, SLURM, checked, refusal, with_value

from parcel_hpc.checkpoints.cadence import Cadence, due
from parcel_hpc.trainer import Budget
from parcel_hpc.trainer.run import Run


@pytest.mark.parametrize(
    ("step", "seconds", "cadence", "expected"),
    [
        (10, 0.0, Cadence(every_steps=10), True),
        (11, 999.0, Cadence(every_steps=10), False),  # steps: the clock is not asked
        (20, 0.0, Cadence(every_steps=10), True),
        (3, 29.9, Cadence(every_s=30.0), False),
        (4, 30.0, Cadence(every_s=30.0), True),
        (1, 0.5, Cadence(every_s=0.25), True),
    ],
)
def test_due_is_a_pure_function_of_the_step_the_seconds_since_the_last_save_and_the_cadence(step, seconds, cadence, expected):
    assert due(step, seconds, cadence) is expected


@pytest.mark.parametrize("kwargs", [{}, {"every_steps": 5, "every_s": 2.0}, {"every_steps": 0}, {"every_s": 0.0}])
def test_a_cadence_is_exactly_one_positive_setting(kwargs):
    with pytest.raises(ValueError):
        Cadence(**kwargs)


class Clocked(Run):
    """A run that keeps nothing, its clock moved by the test."""

    def __init__(self, budget, clock):
        super().__init__({}, 0, type("Data", (), {"budget": budget})(), lambda scores: 0.0, clock)

    def _restore(self):
        return None

    def _stepped(self, step):
        return None

    def _save(self, step, state):
        pass

    def _validated(self, step, value, final, metrics):
        return None


def test_a_run_saves_at_the_first_step_once_the_seconds_have_passed_since_its_last_save():
    from parcel_hpc.trainer import TrainerState

    now = [100.0]
    run = Clocked(Budget(steps=9, cadence=Cadence(every_s=10.0)), lambda: now[0])
    run.restore()
    saved = []
    for step in range(1, 10):
        now[0] += 4.0  # each step takes 4 s: due at 12 s, then 12 s after that save
        if run.stepped(step).checkpoint:
            run.save(TrainerState({"w": [float(step)]}))
            saved.append(step)
    assert saved == [3, 6, 9]  # 9: the last step is always saved


def test_the_launch_takes_one_cadence_and_derives_the_default_from_the_signal_delay():
    cfg, _ = checked(CFG, SLURM)
    assert (cfg["checkpoint"]["every_steps"], cfg["checkpoint"]["every_s"]) == (None, float(SLURM["signal_delay_s"]))
    cfg, _ = checked(with_value("checkpoint.every_steps", 7), SLURM)
    assert (cfg["checkpoint"]["every_steps"], cfg["checkpoint"]["every_s"]) == (7, None)
    cfg, _ = checked(with_value("checkpoint.every_s", 12), SLURM)
    assert (cfg["checkpoint"]["every_steps"], cfg["checkpoint"]["every_s"]) == (None, 12.0)
    both = with_value("checkpoint.every_s", 12.5, with_value("checkpoint.every_steps", 7))
    message = refusal(both)
    assert message.startswith("checkpoint.every_s=12.5 is given with checkpoint.every_steps=7; give one cadence")
    assert refusal(with_value("checkpoint.every_s", 0)).startswith("checkpoint.every_s=0 is out of range")
    assert CFG == copy.deepcopy(CFG) and CFG["checkpoint"].get("every_s") is None  # the caller's config is not changed
