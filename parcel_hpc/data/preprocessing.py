"""Preprocessing by pinned revision; every statistic is fitted on the train partition only.

Owns the feature revisions and the fitted ``Preprocessor``: the loader fits it on the train
partition and hands trainers its features; a trainer's serving path keeps its statistics
(``arrays``) and applies it to raw images. Must not: read files or know about trials.

- ``pool4-r2``: average-pool the image (``pool`` pixels a side) and standardise: position-bound
  pixel features, weak for damage that can appear anywhere on a parcel.
- ``stats-r1``: position-invariant statistics of the per-image normalised intensities, their
  gradient magnitudes and sorted local block means/spreads (dark blotches, jagged tears and small
  holes move these wherever they are), then standardised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from parcel_hpc.errors import UsageError

SUPPORTED_REVISIONS = ("pool4-r2", "stats-r1")
_QUANTILES = np.linspace(0.02, 0.98, 12)


def pool(images: np.ndarray, k: int) -> np.ndarray:
    n, h, w = images.shape
    if h % k or w % k:
        raise UsageError(f"preprocessing.pool={k} does not divide the {h}x{w} images; choose a divisor of both")
    return images.reshape(n, h // k, k, w // k, k).mean(axis=(2, 4)).reshape(n, -1)


def image_stats(images: np.ndarray, k: int) -> np.ndarray:
    n, h, w = images.shape
    if h % k or w % k:
        raise UsageError(f"preprocessing.pool={k} does not divide the {h}x{w} images; choose a divisor of both")
    x = images.astype(np.float64)
    mu = x.mean(axis=(1, 2), keepdims=True)
    sd = x.std(axis=(1, 2), keepdims=True) + 1e-6
    z = (x - mu) / sd
    grad = np.hypot(np.diff(z, axis=2)[:, :-1, :], np.diff(z, axis=1)[:, :, :-1])
    blocks = z.reshape(n, h // k, k, w // k, k)
    block_mean = np.sort(blocks.mean(axis=(2, 4)).reshape(n, -1), axis=1)
    block_std = np.sort(blocks.std(axis=(2, 4)).reshape(n, -1), axis=1)
    step = max(1, block_mean.shape[1] // 16)
    return np.concatenate(
        [
            np.quantile(z.reshape(n, -1), _QUANTILES, axis=1).T,
            np.quantile(grad.reshape(n, -1), _QUANTILES, axis=1).T,
            block_mean[:, ::step],
            block_std[:, ::step],
            mu.reshape(n, 1),
            sd.reshape(n, 1),
        ],
        axis=1,
    )


def _extractor(revision: str) -> Callable[[np.ndarray, int], np.ndarray]:
    if revision == "pool4-r2":
        return pool
    if revision == "stats-r1":
        return image_stats
    raise UsageError(f"preprocessing.revision={revision!r} is unknown to this worker; use one of {', '.join(SUPPORTED_REVISIONS)}")


@dataclass(frozen=True)
class Preprocessor:
    """A feature revision with its standardisation statistics, fitted on the train partition only."""

    revision: str
    pool: int
    mean: np.ndarray
    std: np.ndarray

    def __post_init__(self) -> None:
        for arr in (self.mean, self.std):  # shared by the trials of a pack: nobody may change them
            arr.flags.writeable = False

    @staticmethod
    def check(revision: str, k: int, frames: np.ndarray) -> None:
        """The revision and pool applied to ``frames`` (one is enough): their ``UsageError`` where they cannot be."""
        _extractor(revision)(frames.astype(np.float64), k)

    @classmethod
    def fit_transform(cls, revision: str, k: int, train_images: np.ndarray) -> tuple[Preprocessor, np.ndarray]:
        """Fit on the train images (validation statistics must not leak into training); their features."""
        raw = _extractor(revision)(train_images.astype(np.float64), k)
        fitted = cls(revision, k, raw.mean(axis=0), raw.std(axis=0) + 1e-6)
        return fitted, fitted._standardize(raw)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """Features of raw images (n, H, W): the same function for training, validation and serving."""
        return self._standardize(_extractor(self.revision)(np.asarray(images).astype(np.float64), self.pool))

    def _standardize(self, raw: np.ndarray) -> np.ndarray:
        return (raw - self.mean) / self.std

    def arrays(self) -> dict[str, np.ndarray]:
        """The fitted statistics, for a trainer's state (a served model carries its preprocessing)."""
        return {"mean": self.mean, "std": self.std}

    @classmethod
    def from_arrays(cls, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Preprocessor:
        return cls(str(spec["revision"]), int(spec["pool"]), np.array(arrays["mean"]), np.array(arrays["std"]))

    @classmethod
    def unfitted(cls, spec: Mapping[str, Any], frame_shape: tuple[int, int]) -> Preprocessor:
        """The revision for frames of ``frame_shape`` with no statistics (NaN, of the fitted width): what a
        served trainer is built with. It must take its statistics from its state (``from_arrays``); one that
        does not serves NaN, which the serving-parity check names, never plausible numbers."""
        revision, k = str(spec["revision"]), int(spec["pool"])
        width = _extractor(revision)(np.zeros((1, *frame_shape)), k).shape[1]
        return cls(revision, k, np.full(width, np.nan), np.full(width, np.nan))
