"""Preprocessing by pinned revision; every statistic is fitted on the train partition only.

- ``pool4-r2``: average-pool the image (``pool`` pixels a side) and standardise: position-bound
  pixel features, weak for damage that can appear anywhere on a parcel.
- ``stats-r1``: position-invariant statistics of the per-image normalised intensities, their
  gradient magnitudes and sorted local block means/spreads (dark blotches, jagged tears and small
  holes move these wherever they are), then standardised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

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


@dataclass(frozen=True)
class Standardizer:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardizer:
        # Fitted on the train partition only: validation statistics must not leak into training.
        return cls(x.mean(axis=0), x.std(axis=0) + 1e-6)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.std


def featurize(train_images: np.ndarray, other: list[np.ndarray], revision: str, k: int) -> tuple[np.ndarray, list[np.ndarray]]:
    if revision == "pool4-r2":
        extract = pool
    elif revision == "stats-r1":
        extract = image_stats
    else:
        raise UsageError(f"preprocessing.revision={revision!r} is unknown to this worker; use one of {', '.join(SUPPORTED_REVISIONS)}")
    x_train = extract(train_images.astype(np.float64), k)
    scale = Standardizer.fit(x_train)
    return scale(x_train), [scale(extract(o.astype(np.float64), k)) for o in other]
