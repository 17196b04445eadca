import pytest
from hypothesis import given
from hypothesis import strategies as st

from parcel_hpc.errors import UsageError
from parcel_hpc.sweep.space import sample

SPACE = {
    "lr": {"type": "loguniform", "low": 0.003, "high": 0.3},
    "hidden": {"type": "choice", "values": [0, 16, 32]},
    "drop": {"type": "uniform", "low": 0.0, "high": 0.5},
}


@given(seed=st.integers(0, 2**31), index=st.integers(0, 10_000))
def test_sampling_is_reproducible_and_in_range(seed, index):
    a, b = sample(SPACE, seed, index), sample(SPACE, seed, index)
    assert a == b
    assert 0.003 <= a["lr"] <= 0.3 and a["hidden"] in (0, 16, 32) and 0.0 <= a["drop"] <= 0.5


def test_trial_i_does_not_depend_on_how_many_are_proposed():
    first = [sample(SPACE, 7, i) for i in range(40)]
    assert first == [sample(SPACE, 7, i) for i in range(82)][:40]
    assert len({tuple(sorted(p.items())) for p in first}) > 30
    assert sample(SPACE, 8, 0) != sample(SPACE, 7, 0)


@pytest.mark.parametrize("bad", [{"type": "choice", "values": []}, {"type": "loguniform", "low": 0, "high": 1}, {"type": "normal"}])
def test_bad_space_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        sample({"x": bad}, 0, 0)
