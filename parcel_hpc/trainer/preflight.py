"""The launch's preflight: the trainer tried at the space's corners before anything is frozen.

A mistake in a trainer (a parameter it reads but does not declare, a kind it cannot take, a state it
cannot load back) would otherwise fail every trial of the search, one job at a time. Before the
first freeze the launch builds the trainer on a few examples with each corner of the space (every
parameter at its low end, then at its high end) and with any fixed parameter set it will train
(the baseline's), takes one step, hands its state to a fresh build and predicts. A failure is bad
input: one line with the trainer's own message, exit 2, nothing written. ``check-trainer`` runs
the longer conformance check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from parcel_hpc.errors import UsageError
from parcel_hpc.trainer.base import Trainer, checked_probabilities, finite_metrics
from parcel_hpc.trainer.data import Examples, TrainingData
from parcel_hpc.trainer.params import Param, with_defaults

EXAMPLES = 32  # per partition: enough for both classes, few enough to take well under a second


def corners(space: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every parameter at its first/low end, then at its last/high end (one set when they agree)."""
    low = {name: spec["values"][0] if spec["type"] == "choice" else spec["low"] for name, spec in space.items()}
    high = {name: spec["values"][-1] if spec["type"] == "choice" else spec["high"] for name, spec in space.items()}
    return [low] if low == high else [low, high]


def few_examples(data: TrainingData, n: int = EXAMPLES) -> TrainingData:
    """``n`` examples of each partition, both classes where the partition has them."""

    def pick(part: Examples) -> Examples:
        positives, negatives = np.flatnonzero(part.labels), np.flatnonzero(~part.labels)
        idx = np.sort(np.concatenate([positives[: n // 2], negatives[: n - min(n // 2, len(positives))]]))
        features = part.features[idx]
        features.flags.writeable = False
        return Examples(part.images[idx], features, part.labels[idx], part.damage_type[idx], part.camera_class[idx], part.shipment_id[idx])

    return replace(data, train=pick(data.train), validation=pick(data.validation), _asked_for_final=[])


def preflight(
    cls: type[Trainer], target: str, declared: Mapping[str, Param], trials: Sequence[tuple[str, Mapping[str, Any]]], seed: int, data: TrainingData
) -> None:
    """Build, step, state, load_state and predict for each ``(what, params)``; ``UsageError`` on the first failure."""
    for what, params in trials:
        built = with_defaults(declared, params)
        try:
            first = cls()
            first.build(built, seed, data)
            finite_metrics(first.step(), 1)
            state = first.state().checked()
            second = cls()
            second.build(built, seed, data)
            second.load_state(state)
            checked_probabilities(second.predict("validation"), len(data.validation), "validation", 1)
        except Exception as exc:  # the trainer's own error, whatever it is, is the finding
            message = " ".join(str(exc).split()) or "no message"
            raise UsageError(
                f"preflight: {target} fails with {what} {_shown(params)}: {type(exc).__name__}: {message}; "
                f"fix the trainer (`parcel-hpc check-trainer {target}` runs the whole check)"
            ) from None


def _shown(params: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) + "}"
