"""The launch's preflight: the trainer tried at the space's corners before anything is frozen.

A mistake in a trainer (a parameter it reads but does not declare, a kind it cannot take, a state it
cannot load back, a state that leaves out what decides the next step) would otherwise fail every
trial of the search, or change the metric of every preempted one. Before the first freeze the
launch runs the trainer, of either form, on a few examples with each corner of the space (every
parameter at its low end, then at its high end) and with any fixed parameter set it will train
(the baseline's): k steps, a save, a restore in a fresh build, k more, compared with an
uninterrupted run (``resume.py``). A failure, a drifting resume (beyond ``train.resume_tolerance``)
or a declared parameter no run read is bad input: one line naming what differs first, exit 2,
nothing written. ``check-trainer`` runs the longer conformance check.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from parcel_hpc.errors import UsageError
from parcel_hpc.trainer.base import Trainer
from parcel_hpc.trainer.data import Examples, TrainingData
from parcel_hpc.trainer.params import Param, with_defaults
from parcel_hpc.trainer.resume import check_resume

EXAMPLES = 32  # per partition: enough for both classes, few enough to take well under a second


def corners(space: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every parameter at its first/low end, then at its last/high end (one set when they agree)."""
    low = {name: spec["values"][0] if spec["type"] == "choice" else spec["low"] for name, spec in space.items()}
    high = {name: spec["values"][-1] if spec["type"] == "choice" else spec["high"] for name, spec in space.items()}
    return [low] if low == high else [low, high]


class _Picked:
    """The features of a few of a partition's examples: the whole train partition's fit, made only if
    the trainer asks for a feature (it pickles, as the data it stands in for does)."""

    def __init__(self, part: Examples, idx: np.ndarray) -> None:
        self._part, self._idx = part, idx
        self._picked: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._picked is None:
            picked = self._part.features[self._idx]
            picked.flags.writeable = False
            self._picked = picked
        return self._picked

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the picked rows alone, never the whole partition behind them."""
        return _read_only, (self(),)


def _read_only(rows: np.ndarray) -> np.ndarray:
    rows.flags.writeable = False
    return rows


def few_examples(data: TrainingData, n: int = EXAMPLES) -> TrainingData:
    """``n`` examples of each partition, both classes where the partition has them."""

    def pick(part: Examples) -> Examples:
        positives, negatives = np.flatnonzero(part.labels), np.flatnonzero(~part.labels)
        idx = np.sort(np.concatenate([positives[: n // 2], negatives[: n - min(n // 2, len(positives))]]))
        return Examples(part.images[idx], _Picked(part, idx), part.labels[idx], part.damage_type[idx], part.camera_class[idx], part.shipment_id[idx])

    return replace(data, train=pick(data.train), validation=pick(data.validation), _asked_for_final=[])


def preflight(
    cls: type[Trainer],
    target: str,
    declared: Mapping[str, Param],
    trials: Sequence[tuple[str, Mapping[str, Any]]],
    seed: int,
    data: TrainingData,
    tolerance: float = 0.0,
) -> None:
    """For each ``(what, params)``: k steps, a save, a restore in a fresh build, k more, against an
    uninterrupted run (``resume.check_resume``); ``UsageError`` on the first failure or drift beyond
    ``tolerance`` (``train.resume_tolerance``), and for a declared parameter no trial read."""
    unread: set[str] | None = None
    for what, params in trials:
        try:
            with quiet():
                found = check_resume(cls, with_defaults(declared, params), seed, data)
        except Exception as exc:  # the trainer's own error, whatever it is, is the finding
            message = " ".join(str(exc).split()) or "no message"
            raise UsageError(
                f"preflight: {target} fails with {what} {_shown(params)}: {type(exc).__name__}: {message}; "
                f"fix the trainer (`parcel-hpc check-trainer {target}` runs the whole check)"
            ) from None
        if not found.exact and not found.largest <= tolerance:
            allowed = f" beyond train.resume_tolerance={tolerance:g}" if tolerance else ""
            raise UsageError(
                f"preflight: {target} does not resume exactly{allowed} with {what} {_shown(params)}: {found.detail}; "
                "a preempted trial would end with another metric than an uninterrupted one"
            )
        unread = set(found.unread) if unread is None else unread & set(found.unread)
    if unread:
        names = ", ".join(sorted(unread))
        raise UsageError(
            f"preflight: {target} declares {names} but never reads {'them' if len(unread) > 1 else 'it'}: the search would vary "
            f"{'them' if len(unread) > 1 else 'it'} and change nothing; read {sorted(unread)[0]} from params (or run.params) or remove it from the trainer's parameters"
        )


@contextmanager
def quiet() -> Iterator[None]:
    """The trainer's libraries' logging and warnings held back while it is tried (Lightning announces
    its accelerator and hints at srun on every fit): the launch's refusal stays one line."""
    held = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(held)


def _shown(params: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) + "}"
