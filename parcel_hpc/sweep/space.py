"""Reproducible sampling of the search space (pure).

Trial ``i`` draws from its own generator seeded by (search seed, i): proposing 40 trials and later
82 gives the same first 40, and two launchers on two machines propose identical trials.
Continuous values are rounded to 4 significant digits so that a configuration is printable
exactly and a duplicate is a real duplicate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import UsageError


def sample(space: Mapping[str, Mapping[str, Any]], seed: int, index: int) -> dict[str, Any]:
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    params: dict[str, Any] = {}
    for name in sorted(space):
        spec = space[name]
        kind = spec.get("type")
        if kind == "choice":
            values = list(spec.get("values") or [])
            if not values:
                raise UsageError(f"space.params.{name} has no values; give type: choice with values: [...]")
            params[name] = _plain(values[int(rng.integers(0, len(values)))])
        elif kind in ("uniform", "loguniform"):
            low, high = float(spec["low"]), float(spec["high"])
            if not low < high or (kind == "loguniform" and low <= 0):
                raise UsageError(f"space.params.{name}: need 0 < low < high for {kind} (got low={low}, high={high})")
            u = float(rng.random())
            value = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if kind == "loguniform" else low + u * (high - low)
            params[name] = float(f"{value:.4g}")
        else:
            raise UsageError(f"space.params.{name}.type={kind!r} is unknown; use choice, uniform or loguniform")
    return params


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
