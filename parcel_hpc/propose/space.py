"""The search space: one normalized form from either syntax, and history-free sampling of it (pure).

A space is written as a ``space`` config group (``{type: choice|uniform|loguniform|int|float, ...}``)
or in Hydra's sweep grammar, under ``hydra.sweeper.params`` and on the command line
(``lr='tag(log, interval(0.003, 0.3))'``, ``hidden='choice(0,16,32)'``, ``width='range(8,65,8)'``);
later sources win per parameter, as in Hydra's own sweepers. Both become the same normalized form::

    {"type": "choice", "values": [...]}                                # in the order given
    {"type": "float", "low": 0.003, "high": 0.3, "log": true, "step": null}
    {"type": "int", "low": 8, "high": 64, "log": false, "step": 8}     # high is the last value drawn

which the contract pins with its digest. Hydra's ``range`` excludes its stop (its basic sweeper
does), so ``range(8,65,8)`` ends at 64; hydra-optuna-sweeper would also draw 65.

Sampling trial ``i`` from its own generator seeded by (search seed, i) (``sampler=random``) means
proposing 40 trials and later 82 gives the same first 40. Continuous values are rounded to 4
significant digits so that a configuration prints exactly and a duplicate is a real duplicate.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import digest_of

CHOICE, FLOAT, INT = "choice", "float", "int"
_TYPES = "choice, uniform, loguniform, int or float"
_KEYS = {
    CHOICE: {"type", "values"},
    "uniform": {"type", "low", "high"},
    "loguniform": {"type", "low", "high"},
    FLOAT: {"type", "low", "high", "log", "step"},
    INT: {"type", "low", "high", "log", "step"},
}


def normalize(params: Mapping[str, Mapping[str, Any]], grammar: Sequence[str] = (), sections: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The ``space`` group's ``params`` with the grammar overrides (``"name=expression"``) on top,
    normalized and sorted by name. ``sections``: the config's top-level keys, which a sweep may not
    name. UsageError (one line, naming the parameter) on bad input."""
    out = {str(name): _from_group(str(name), spec) for name, spec in params.items()}
    out.update(from_grammar(grammar, sections))
    if not out:
        raise UsageError("the search space is empty; give space=space_r4 or sweep parameters such as lr='tag(log,interval(0.003,0.3))'")
    return {name: out[name] for name in sorted(out)}


def space_digest(space: Mapping[str, Mapping[str, Any]]) -> str:
    return digest_of(space)


def from_grammar(items: Sequence[str], sections: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """Hydra sweep overrides parsed by Hydra's own parser, then normalized."""
    if not items:
        return {}
    from hydra.core.override_parser.overrides_parser import OverridesParser  # Hydra is loaded only when the grammar is used
    from hydra.errors import OverrideParseException

    out = {}
    for item in items:
        try:
            (override,) = OverridesParser.create().parse_overrides([item])
        except OverrideParseException as exc:
            raise UsageError(
                f"sweep parameter {item!r} is malformed ({_first_line(exc)}); write e.g. lr='tag(log,interval(0.003,0.3))' or hidden='choice(0,16,32)'"
            ) from None
        name = override.get_key_element()
        if not (name.isidentifier() and len(name) <= 64):
            raise UsageError(
                f"sweep override {item!r}: {name} is not a trial parameter; sweeps draw trial parameters by name, "
                "e.g. lr='tag(log,interval(0.003,0.3))' (a changed config needs a new search.revision)"
            )
        if name in sections:  # Hydra drops a group sweep (sampler=tpe,gp) from the defaults: it would reach here as a parameter
            raise UsageError(
                f"sweep override {item!r}: {name} is a config group or section, not a trial parameter; a search has one {name}: "
                "launch each choice as its own search.revision"
            )
        out[name] = _from_override(name, override, item)
    return out


def _from_override(name: str, override: Any, item: str) -> dict[str, Any]:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    if override.is_delete() or override.is_add() or override.is_force_add():
        raise UsageError(f"sweep parameter {item!r}: give it as name=expression (no ~ or + prefix)")
    if not override.is_sweep_override():
        raise UsageError(
            f"sweep parameter {item!r} is a single value; sweep it with choice(...), range(...) or interval(...), or fix it in the trainer's config"
        )
    sweep = override.value()
    tags = set(sweep.tags or ())
    unknown = sorted(tags - {"log"})
    if unknown:
        raise UsageError(f"sweep parameter {item!r}: tag {unknown[0]!r} means nothing here; the one tag is log, as in tag(log, interval(1e-4, 1e-1))")
    if isinstance(sweep, ChoiceSweep):
        if getattr(sweep, "shuffle", False):
            raise UsageError(f"sweep parameter {item!r}: shuffle(...) draws a different order each run; a choice's order is part of the pinned space")
        if tags:
            raise UsageError(f"sweep parameter {item!r}: a choice takes no log tag; use tag(log, interval(...)) or list the values")
        return _choice(name, list(sweep.list), item)
    if isinstance(sweep, RangeSweep):
        if sweep.shuffle:
            raise UsageError(f"sweep parameter {item!r}: shuffle(...) draws a different order each run; give range(...) alone")
        if tags:
            raise UsageError(f"sweep parameter {item!r}: a range takes no log tag (its values are evenly spaced); use tag(log, int(interval(...)))")
        return _range(name, sweep.start, sweep.stop, sweep.step, item)
    if isinstance(sweep, IntervalSweep):
        kind = INT if isinstance(sweep.start, int) and isinstance(sweep.end, int) else FLOAT
        return _bounded(name, kind, sweep.start, sweep.end, "log" in tags, None, item)
    raise UsageError(f"sweep parameter {item!r}: glob(...) selects config files, not values; use choice(...), range(...) or interval(...)")


def _from_group(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    where = f"space.params.{name}"
    kind: Any = spec.get("type") if isinstance(spec, Mapping) else None
    unknown = sorted(set(spec) - _KEYS[kind]) if kind in _KEYS else []
    if unknown:
        raise UsageError(f"{where}.{unknown[0]} means nothing for type {kind}; its keys are {', '.join(sorted(_KEYS[kind]))}")
    if kind == CHOICE:
        values = spec.get("values")
        if not isinstance(values, (list, tuple)):
            raise UsageError(f"{where}.values={values!r} is not a list; give values: [0, 16, 32]")
        return _choice(name, list(values), where)
    if kind in ("uniform", "loguniform"):
        return _bounded(name, FLOAT, spec.get("low"), spec.get("high"), kind == "loguniform", None, where)
    if kind in (FLOAT, INT):
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise UsageError(f"{where}.log={log!r} must be true or false")
        return _bounded(name, kind, spec.get("low"), spec.get("high"), log, spec.get("step"), where)
    raise UsageError(f"{where}.type={kind!r} is unknown; use {_TYPES}")


def _choice(name: str, values: list, where: str) -> dict[str, Any]:
    if not values:
        raise UsageError(f"{where}: {name} has no values; give at least one, e.g. choice(0, 16, 32)")
    for v in values:
        if v is None or isinstance(v, (list, dict, tuple)) or (isinstance(v, float) and not math.isfinite(v)):
            raise UsageError(f"{where}: {name} value {v!r} is not a plain number, text or boolean; a choice lists scalars")
    if len(set(values)) != len(values):  # 1, 1.0 and true are one value to Python (and to Optuna's index)
        raise UsageError(f"{where}: {name} lists a value twice (1, 1.0 and true count as one); list each value once")
    return {"type": CHOICE, "values": [_plain(v) for v in values]}


def _range(name: str, start: Any, stop: Any, step: Any, where: str) -> dict[str, Any]:
    if step == 0:
        raise UsageError(f"{where}: {name} has step 0; give a positive step, e.g. range(8, 65, 8)")
    if step < 0:
        raise UsageError(f"{where}: {name} counts down; write it counting up, e.g. range(1, 10, 2)")
    # Counted, never listed (range(0, 10**9) is one line of config). Hydra's float range steps in
    # decimals, so 0.1 steps land on 0.3, not 0.30000000000000004.
    d_start, d_stop, d_step = (Decimal(str(v)) for v in (start, stop, step))
    count = max(0, math.ceil((d_stop - d_start) / d_step))
    kind = INT if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, step)) else FLOAT
    if count == 0:
        raise UsageError(f"{where}: {name}'s range is empty (Hydra's range excludes its stop); give stop above start")
    first, last = d_start, d_start + (count - 1) * d_step
    number = int if kind == INT else float
    if count == 1:
        return {"type": CHOICE, "values": [number(first)]}
    return _bounded(name, kind, number(first), number(last), False, step, where)


def _bounded(name: str, kind: str, low: Any, high: Any, log: bool, step: Any, where: str) -> dict[str, Any]:
    for label, v in (("low", low), ("high", high), ("step", step)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise UsageError(f"{where}: {name}.{label}={v!r} is not a finite number")
    if low is None or high is None:
        raise UsageError(f"{where}: {name} needs low and high")
    if not low < high:
        raise UsageError(f"{where}: {name} needs low < high (got low={low}, high={high})")
    if log and low <= 0:
        raise UsageError(f"{where}: {name} is log-scaled, so its bounds must be positive (got low={low}); raise low above 0 or drop the log tag")
    if log and step is not None and not (kind == INT and step == 1):
        raise UsageError(f"{where}: {name} is log-scaled with a step; give one or the other")
    if step is not None and step <= 0:
        raise UsageError(f"{where}: {name}.step={step} must be positive")
    if kind == INT:
        if not all(float(v).is_integer() for v in (low, high, step or 1)):
            raise UsageError(f"{where}: {name} is an integer parameter with a fractional bound or step; give whole numbers")
        step = int(step or 1)
        high = int(low) + (int(high) - int(low)) // step * step  # the last value drawn
        if high == int(low):
            raise UsageError(f"{where}: {name}'s step {step} is wider than low..high, so it has one value; narrow the step or use choice({int(low)})")
        return {"type": INT, "low": int(low), "high": high, "log": log, "step": step}
    if step is not None:
        d_low, d_step = Decimal(str(low)), Decimal(str(step))
        last = d_low + int((Decimal(str(high)) - d_low) / d_step) * d_step  # the last grid value inside the bounds
        if last == d_low:
            raise UsageError(f"{where}: {name}'s step {step} is wider than low..high, so it has one value; narrow the step or use choice({low})")
        return {"type": FLOAT, "low": float(low), "high": float(last), "log": False, "step": float(step)}
    return {"type": FLOAT, "low": float(low), "high": float(high), "log": log, "step": None}


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200]


# --- sampling ----------------------------------------------------------------------------------


def sample(space: Mapping[str, Mapping[str, Any]], seed: int, index: int) -> dict[str, Any]:
    """Trial ``index`` of ``sampler=random``: its own generator, seeded by (seed, index)."""
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    params: dict[str, Any] = {}
    for name in sorted(space):
        spec = space[name]
        if spec["type"] == CHOICE:
            params[name] = spec["values"][int(rng.integers(0, len(spec["values"])))]
        elif spec["type"] == FLOAT and spec["step"] is None:
            params[name] = from_unit(spec, float(rng.random()))
        else:
            params[name] = grid_value(spec, int(rng.integers(0, grid_size(spec)))) if not spec["log"] else from_unit(spec, float(rng.random()))
    return params


def from_unit(spec: Mapping[str, Any], u: float) -> Any:
    """The parameter value at ``u`` in [0, 1) (uniform, or uniform in log for a log scale)."""
    if spec["type"] == CHOICE:
        values = spec["values"]
        return values[min(int(u * len(values)), len(values) - 1)]
    low, high = spec["low"], spec["high"]
    if spec["type"] == INT:
        if spec["log"]:  # each integer gets the log-width of its half-open neighbourhood
            lo, hi = math.log(low - 0.5 if low > 0.5 else low), math.log(high + 0.5)
            return min(high, max(low, round(math.exp(lo + u * (hi - lo)))))
        return grid_value(spec, min(int(u * grid_size(spec)), grid_size(spec) - 1))
    if spec["step"] is not None:
        return grid_value(spec, min(int(u * grid_size(spec)), grid_size(spec) - 1))
    value = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if spec["log"] else low + u * (high - low)
    return rounded(spec, value)


def grid_size(spec: Mapping[str, Any]) -> int:
    return int(round((spec["high"] - spec["low"]) / spec["step"])) + 1


def grid_value(spec: Mapping[str, Any], i: int) -> Any:
    if spec["type"] == INT:
        return spec["low"] + i * spec["step"]
    return float(Decimal(str(spec["low"])) + i * Decimal(str(spec["step"])))


def rounded(spec: Mapping[str, Any], value: Any) -> Any:
    """A drawn value as the trial records it: 4 significant digits (or the step's grid), inside the bounds."""
    if spec["type"] == CHOICE:
        return _plain(value)
    if spec["type"] == INT:
        return int(min(spec["high"], max(spec["low"], int(round(value)))))
    if spec["step"] is not None:
        i = min(grid_size(spec) - 1, max(0, int(round((value - spec["low"]) / spec["step"]))))
        return grid_value(spec, i)
    return min(spec["high"], max(spec["low"], float(f"{float(value):.4g}")))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def qmc_points(space: Mapping[str, Mapping[str, Any]], seed: int, start: int, stop: int, qmc_type: str, scramble: bool) -> list[dict[str, Any]]:
    """Trials ``start..stop-1`` of ``sampler=qmc``: point i of the seeded low-discrepancy sequence,
    one dimension per parameter in name order (history-free, so proposed at once like random)."""
    from scipy.stats import qmc  # only a QMC search needs SciPy

    names = sorted(space)
    engine = (qmc.Sobol if qmc_type == "sobol" else qmc.Halton)(d=len(names), scramble=scramble, seed=seed)
    if start:
        engine.fast_forward(start)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Sobol's "n should be a power of 2": trials are drawn as slots need them
        rows = engine.random(stop - start) if stop > start else np.empty((0, len(names)))
    return [{name: from_unit(space[name], float(u)) for name, u in zip(names, row)} for row in rows]
