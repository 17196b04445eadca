"""What every benchmark returns and how the runner shows it. Most figures are a ratio of our time
over a baseline's, both measured in the same run, alternating, repetition by repetition; a few are
a measured quantity against its target (a fraction saved, a memory ceiling)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Figure:
    name: str
    baseline: str  # what the value is measured against
    values: list[float]  # one per repetition
    target: float
    at_least: bool = False  # the target is a floor (True) or a ceiling (False)
    unit: str = "x"
    note: str = ""
    samples: dict = field(default_factory=dict)  # the raw measurements behind ``values``

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def met(self) -> bool:
        return self.median >= self.target if self.at_least else self.median <= self.target

    def to_json(self) -> dict:
        return {**asdict(self), "median": self.median, "min": min(self.values), "max": max(self.values), "met": self.met}


def ratio(name: str, baseline: str, ours_s: list[float], baseline_s: list[float], target: float, note: str = "") -> Figure:
    """Our time over the baseline's, per repetition."""
    return Figure(name, baseline, [a / b for a, b in zip(ours_s, baseline_s)], target, note=note, samples={"ours_s": ours_s, "baseline_s": baseline_s})


def alternate(ours: Callable[[], object], baseline: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    """Time ``baseline`` then ``ours``, ``repeats`` times, alternating, so both see the same machine."""
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((baseline, b), (ours, a)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return a, b
