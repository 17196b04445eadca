"""When a checkpoint is due: the cadence (every so many steps, or seconds of training) and the decision.

Owns ``Cadence`` and ``due``, the one place every trainer form asks "save now?" (``Run.stepped``,
through ``Budget.checkpoint_due``; the scheduler's signal and the last step are the run's own).
A cadence in steps saves at every multiple of it, as it always did; one in seconds saves at the
first step boundary once that much time has passed since the last save (or the start), so the
setting does not depend on a step time nobody knows before the search.

Must not: read a clock or the config (the run hands it the seconds; the launch resolves the default,
``governance/validation.checked``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cadence:
    """Exactly one of ``every_steps`` (training steps) and ``every_s`` (seconds of training)."""

    every_steps: int | None = None  # a checkpoint at every multiple of this step count
    every_s: float | None = None  # a checkpoint once this many seconds have passed since the last

    def __post_init__(self) -> None:
        if (self.every_steps is None) == (self.every_s is None):
            raise ValueError(f"a cadence is every_steps or every_s, exactly one (given {self.every_steps!r} and {self.every_s!r})")
        if self.every_steps is not None and self.every_steps < 1 or self.every_s is not None and not self.every_s > 0:
            raise ValueError(f"a cadence is positive (given every_steps={self.every_steps!r}, every_s={self.every_s!r})")


def due(step: int, seconds_since_save: float, cadence: Cadence) -> bool:
    """Whether the cadence asks for a checkpoint after ``step``, ``seconds_since_save`` after the last (pure)."""
    if cadence.every_steps is not None:
        return step % cadence.every_steps == 0
    assert cadence.every_s is not None  # __post_init__: exactly one is set
    return seconds_since_save >= cadence.every_s
