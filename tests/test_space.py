"""The search space (both syntaxes, one normalized form), the samplers' specs, and proposals drawn
by a sampler that learns (pure: Hydra's own parser, Optuna's ask-and-tell, no files)."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from parcel_hpc.config import CONF_DIR
from parcel_hpc.errors import UsageError
from parcel_hpc.propose import learning, samplers
from parcel_hpc.propose.learning import Told, ToldTrial, ask, proposal_seed, told_digest
from parcel_hpc.propose.space import normalize, qmc_points, sample, space_digest

SPACE = normalize(
    {
        "lr": {"type": "loguniform", "low": 0.003, "high": 0.3},
        "hidden": {"type": "choice", "values": [0, 16, 32]},
        "drop": {"type": "uniform", "low": 0.0, "high": 0.5},
    }
)
SPACE_R4 = yaml.safe_load((CONF_DIR / "space" / "space_r4.yaml").read_text())["params"]
GRAMMAR_R4 = ["lr=tag(log, interval(0.003, 0.3))", "hidden=choice(0,16,32,64)", "l2=tag(log,interval(1e-5,1e-2))", "batch_size=32,64,128"]


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


def test_the_grammar_and_the_yaml_group_normalize_to_one_space_and_digest():
    from_yaml, from_grammar = normalize(SPACE_R4), normalize({}, GRAMMAR_R4)
    assert from_yaml == from_grammar and space_digest(from_yaml) == space_digest(from_grammar)
    assert from_yaml["lr"] == {"type": "float", "low": 0.003, "high": 0.3, "log": True, "step": None}
    assert normalize(from_yaml) == from_yaml  # normalizing twice changes nothing (the contract re-normalizes)
    assert list(from_yaml) == sorted(from_yaml)


def test_later_grammar_wins_per_parameter_like_hydras_sweepers():
    space = normalize(SPACE_R4, ["hidden=choice(8,9)", "hidden=choice(1,2)"])
    assert space["hidden"]["values"] == [1, 2] and space["lr"] == normalize(SPACE_R4)["lr"]


@pytest.mark.parametrize(
    "item,expected",
    [
        ("w=range(8,65,8)", {"type": "int", "low": 8, "high": 64, "log": False, "step": 8}),  # Hydra's stop is exclusive
        ("w=range(1,10,3)", {"type": "int", "low": 1, "high": 7, "log": False, "step": 3}),
        ("f=range(0,1,0.1)", {"type": "float", "low": 0.0, "high": 0.9, "log": False, "step": 0.1}),
        ("n=tag(log,int(interval(1,1024)))", {"type": "int", "low": 1, "high": 1024, "log": True, "step": 1}),
        ("n=int(interval(2,9))", {"type": "int", "low": 2, "high": 9, "log": False, "step": 1}),
        ("z=interval(1,10)", {"type": "float", "low": 1.0, "high": 10.0, "log": False, "step": None}),  # interval() always floats
        ("c=choice(relu,tanh,true)", {"type": "choice", "values": ["relu", "tanh", True]}),
        ("one=range(3,4)", {"type": "choice", "values": [3]}),
    ],
)
def test_grammar_forms(item, expected):
    (value,) = normalize({}, [item]).values()
    assert value == expected


@pytest.mark.parametrize(
    "item,message",
    [
        ("lr=tag(log,interval(0,1))", "bounds must be positive"),
        ("lr=tag(log,interval(-1,1))", "bounds must be positive"),
        ("h=choice()", "malformed"),
        ("h=choice(1,,2)", "malformed"),
        ("h=choice(1,1)", "lists a value twice"),
        ("h=choice(null,1)", "malformed"),
        ("h=choice([1,2],3)", "not a plain number"),
        ("w=range(5,5)", "is empty"),
        ("w=range(9,1,-1)", "counts down"),
        ("h=shuffle(choice(1,2))", "shuffle"),
        ("lr=tag(fast,interval(0.1,1))", "tag 'fast'"),
        ("lr=0.1", "single value"),
        ("search.seed=1,2", "not a trial parameter"),
        ("lr=interval(0.3,0.1)", "low < high"),
        ("h=tag(log,choice(1,2))", "takes no log tag"),
    ],
)
def test_bad_grammar_is_one_line_naming_the_parameter(item, message):
    with pytest.raises(UsageError) as err:
        normalize({}, [item])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("bad", [{"type": "choice", "values": []}, {"type": "loguniform", "low": 0, "high": 1}, {"type": "normal"}])
def test_bad_space_group_is_a_usage_error(bad):
    with pytest.raises(UsageError):
        normalize({"x": bad})


def test_every_kind_samples_inside_its_space():
    space = normalize({}, ["w=range(8,65,8)", "f=range(0,1,0.1)", "n=tag(log,int(interval(1,1024)))", "c=choice(a,b)", "x=interval(-1,1)"])
    for i in range(300):
        p = sample(space, 3, i)
        assert p["w"] in range(8, 65, 8) and 1 <= p["n"] <= 1024 and p["c"] in ("a", "b") and -1 <= p["x"] <= 1
        assert p["f"] in [round(0.1 * j, 10) for j in range(10)]
    points = qmc_points(space, 3, 0, 64, "sobol", True)
    assert points[10:20] == qmc_points(space, 3, 10, 20, "sobol", True)  # point i depends on (seed, i) alone
    assert len({p["w"] for p in points}) == 8  # low-discrepancy: every grid value within 64 points


@pytest.mark.parametrize(
    "node,message",
    [
        ({"name": "hyperband"}, "sampler='hyperband' is unknown"),
        ({"name": "tpe", "n_startup": 3}, "sampler.n_startup is not an option of sampler=tpe"),
        ({"name": "tpe", "n_startup_trials": "ten"}, "must be a whole number"),
        ({"name": "tpe", "multivariate": 1}, "must be true or false"),
        ({"name": "tpe", "group": True, "multivariate": False}, "needs sampler.multivariate=true"),
        ({"name": "qmc", "qmc_type": "lattice"}, "sobol or halton"),
        ({"name": "cmaes", "sigma0": -1}, "positive number or null"),
        ({"name": "random", "seed": 3}, "options are: none"),
    ],
)
def test_bad_sampler_config_is_one_line(node, message):
    with pytest.raises(UsageError) as err:
        samplers.from_config(node)
    assert message in str(err.value)


def test_sampler_spec_spells_out_every_option_and_its_revision():
    spec = samplers.from_config({"name": "tpe", "n_startup_trials": 4})
    assert spec.learns and spec.options == {"n_startup_trials": 4, "n_ei_candidates": 24, "multivariate": True, "group": False, "constant_liar": True}
    assert spec.revision.startswith("optuna ")
    assert not samplers.from_config({"name": "random"}).learns and not samplers.from_config({"name": "qmc"}).learns


def test_gp_without_torch_is_refused_naming_the_fix(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    with pytest.raises(UsageError, match="sampler=gp needs torch, which is not installed; pip install torch"):
        samplers.from_config({"name": "gp"})


def _history(space, spec, n, seed=0):
    """n proposals, each told the ones before (a mix of completed, pruned, failed and running)."""
    told, attrs, out = [], {}, []
    for k in range(n):
        params, state = ask(spec, space, proposal_seed(seed, k), told, attrs)
        attrs[k] = state
        out.append((list(told), params))
        value = (params["lr"] - 0.05) ** 2 + params["hidden"] / 1000
        kind = [Told.COMPLETE, Told.COMPLETE, Told.PRUNED, Told.FAILED, Told.RUNNING][k % 5]
        told.append(ToldTrial(f"t{k:04d}", kind, params, None if kind in (Told.FAILED, Told.RUNNING) else value, 20 if kind is Told.PRUNED else None, k))
    return out, attrs


@pytest.mark.parametrize("name", ["tpe", "cmaes"])
def test_a_learned_proposal_rederives_exactly_from_what_it_was_told(name):
    spec = samplers.from_config({"name": name, "n_startup_trials": 3})
    history, attrs = _history(SPACE, spec, 16)
    for k, (told, params) in enumerate(history):
        assert ask(spec, SPACE, proposal_seed(0, k), told, {j: attrs[j] for j in range(k)}) == (params, attrs[k])
    assert len({tuple(sorted(p.items())) for _, p in history}) == 16
    # what it was told matters: a different result, or another seed, gives another proposal
    told, params = history[12]
    changed = [ToldTrial(t.trial_id, t.told, t.params, None if t.value is None else t.value + 1.0, t.step, t.proposal) for t in told]
    assert told_digest(changed) != told_digest(told)
    assert ask(spec, SPACE, proposal_seed(1, 12), told, attrs)[0] != params


def test_tpe_moves_towards_good_results():
    spec = samplers.from_config({"name": "tpe", "n_startup_trials": 5})
    space = normalize({}, ["x=interval(0,1)"])
    told = []
    for k in range(30):
        params, _ = ask(spec, space, proposal_seed(0, k), told, {})
        told.append(ToldTrial(f"t{k:04d}", Told.COMPLETE, params, (params["x"] - 0.8) ** 2))
    late = [t.params["x"] for t in told[20:]]
    assert sum(abs(x - 0.8) < 0.15 for x in late) >= 7


@pytest.mark.parametrize("name", [n.value for n in samplers.SamplerName])
def test_each_sampler_config_file_spells_out_exactly_the_options_and_defaults_the_code_fills_in(name):
    node = yaml.safe_load((CONF_DIR / "sampler" / f"{name}.yaml").read_text())
    assert node.pop("name") == name
    assert node == samplers.OPTIONS[samplers.SamplerName(name)]


def test_a_stepped_float_never_draws_past_its_bounds():
    space = normalize({"x": {"type": "float", "low": 0, "high": 1, "step": 0.6}, "y": {"type": "float", "low": 0, "high": 1, "step": 0.3}})
    assert space["x"]["high"] == 0.6 and space["y"]["high"] == 0.9
    assert {sample(space, 0, i)["y"] for i in range(200)} == {0.0, 0.3, 0.6, 0.9}
    assert all(0 <= p["x"] <= 1 for p in qmc_points(space, 0, 0, 32, "halton", True))


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"type": "float", "low": 1, "high": 2, "log": True, "step": 1}, "log-scaled with a step"),
        ({"type": "int", "low": 1, "high": 3, "step": 5}, "wider than low..high"),
        ({"type": "choice", "values": [1, True]}, "lists a value twice"),
        ({"type": "uniform", "low": 0, "high": 1, "stp": 1}, "stp means nothing for type uniform"),
        ({"type": "float", "low": 1, "high": 2, "log": "false"}, "must be true or false"),
        ({"type": "choice", "values": "abc"}, "is not a list"),
    ],
)
def test_a_space_group_typo_is_refused_not_ignored(spec, message):
    with pytest.raises(UsageError, match=message):
        normalize({"x": spec})


def test_a_huge_range_is_counted_not_listed():
    assert normalize({}, ["n=range(0,1000000000)"])["n"] == {"type": "int", "low": 0, "high": 999999999, "log": False, "step": 1}


def test_sweeping_a_config_group_is_refused_not_taken_for_a_parameter():
    with pytest.raises(UsageError, match="sampler is a config group or section, not a trial parameter"):
        normalize({}, ["sampler=tpe,gp"], sections={"sampler", "space", "pruner"})


def test_cmaes_options_the_library_refuses_are_refused_before_freezing():
    with pytest.raises(UsageError, match="sampler=cmaes refuses these options"):
        learning.check_options(samplers.from_config({"name": "cmaes", "lr_adapt": True, "use_separable_cma": True}))
    with pytest.raises(UsageError, match="positive whole number"):
        samplers.from_config({"name": "cmaes", "popsize": 2.5})
