"""The miss-cost metric, by pinned revision. Lower is better.

A missed damaged parcel (a false negative) costs ``miss_cost``; a needless manual review (a false
positive) costs ``review_cost``. A trial is scored by the expected cost per frame at the cost-optimal
threshold review_cost / (miss_cost + review_cost), so the metric does not depend on calibration
choices a trial could game.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from parcel_hpc.errors import UsageError

if TYPE_CHECKING:  # the ledger reads FoldScores from here: a read command need not load numpy
    import numpy as np

SUPPORTED_REVISIONS = ("miss-cost-r3",)


@dataclass(frozen=True)
class MissCost:
    revision: str
    miss_cost: float
    review_cost: float

    def __post_init__(self) -> None:
        if self.revision not in SUPPORTED_REVISIONS:
            raise UsageError(f"metric.revision={self.revision!r} is unknown to this worker; use one of {', '.join(SUPPORTED_REVISIONS)}")
        if not (self.miss_cost > 0 and self.review_cost > 0):
            raise UsageError(f"metric costs must be positive (miss_cost={self.miss_cost}, review_cost={self.review_cost})")

    @property
    def threshold(self) -> float:
        return self.review_cost / (self.miss_cost + self.review_cost)

    def __call__(self, probabilities: np.ndarray, labels: np.ndarray) -> float:
        flagged = probabilities >= self.threshold
        positive = labels.astype(bool)
        misses = int((positive & ~flagged).sum())
        reviews = int((~positive & flagged).sum())
        return float((self.miss_cost * misses + self.review_cost * reviews) / max(1, labels.shape[0]))


@dataclass(frozen=True)
class FoldScores:
    """A K-fold trial's metric: one value per fold run, in fold order; the trial's metric is their mean
    (every fold's validation frames are scored once, by a model that never saw them), and their spread
    says how much one split would have told (the sample standard deviation over the folds)."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) < 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in self.values):
            raise ValueError(f"a K-fold trial's metric needs a finite value for each of at least 2 folds, not {self.values!r}")
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def spread(self) -> float:
        mean = self.mean
        return math.sqrt(math.fsum((v - mean) ** 2 for v in self.values) / (len(self.values) - 1))
