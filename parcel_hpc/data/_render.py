"""Draws and renders the synthetic parcels: pure, deterministic, no files.

Owns what a synthetic parcel looks like. A cardboard box (edges, optional tape) on a conveyor
background; the damage is drawn in box coordinates so every frame of a parcel shows the same
damage from a slightly shifted pose:

    torn            a jagged dark gap with a bright lip        easy: many dark pixels
    wet             a darker soft blotch                       easy to medium
    puncture        a small black hole with a shadow ring      medium: few pixels
    crushed_corner  one corner dented: shadow, a crease, the   hard: a few pixels of mild shading
                    tip folded away showing the background

Cameras differ in gain, offset, blur and noise; cam_c (dark, blurred, noisy) is the hard one.
Shipments share a box tone, tape, belt shade and damage rate, so frames of one shipment are
correlated: a split that lets a shipment straddle partitions flatters the validation score.

Determinism on any machine: every random number comes from ``Generator(PCG64(seed)).random()``
(raw 53-bit doubles, a stream numpy keeps stable); normals, integers and categorical draws are
derived here, not by numpy's distribution methods, whose algorithms may change between releases.
All arithmetic is elementwise float64 (no reductions whose order could vary) and pixels are
quantized to uint8 at the end.

Must not: write files or know about HDF5 (synthetic.py does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DAMAGE_LABELS = ("none", "crushed_corner", "torn", "wet", "puncture")
CAMERA_LABELS = ("cam_a", "cam_b", "cam_c")
NONE, CRUSHED, TORN, WET, PUNCTURE = range(len(DAMAGE_LABELS))

_CAMERA_WEIGHTS = (0.40, 0.35, 0.25)
_DAMAGE_WEIGHTS = (0.18, 0.30, 0.26, 0.26)  # crushed, torn, wet, puncture, given the parcel is damaged
# Per camera: gain, offset, blur passes of [1/4, 1/2, 1/4], noise sigma (in 0..1 units).
_CAMERAS = ((1.00, 0.00, 0, 0.025), (1.12, 0.04, 1, 0.05), (0.80, -0.03, 2, 0.14))


@dataclass(frozen=True)
class Rendered:
    images: np.ndarray  # (N, size, size) uint8
    needs_review: np.ndarray  # (N,) uint8 0/1
    shipment_index: np.ndarray  # (N,) int64
    parcel_index: np.ndarray  # (N,) int64, global parcel number
    parcel_in_shipment: np.ndarray  # (N,) int64
    frame: np.ndarray  # (N,) int16
    damage_type: np.ndarray  # (N,) uint8 codes into DAMAGE_LABELS
    camera_class: np.ndarray  # (N,) uint8 codes into CAMERA_LABELS


class _Draw:
    """Every draw derived from raw uniform doubles (see the module docstring for why)."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def uniform(self, lo: float, hi: float, size) -> np.ndarray:
        return lo + (hi - lo) * self._rng.random(size)

    def integers(self, lo: int, hi: int, size) -> np.ndarray:
        """Uniform integers in [lo, hi], both ends included."""
        k = np.floor(self._rng.random(size) * (hi - lo + 1)).astype(np.int64)
        return lo + np.minimum(k, hi - lo)

    def normal(self, size) -> np.ndarray:
        u1, u2 = self._rng.random(size), self._rng.random(size)
        return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)  # Box-Muller; 1-u1 > 0

    def categorical(self, weights, size) -> np.ndarray:
        edges, acc = [], 0.0
        for w in weights:
            acc += w
            edges.append(acc / sum(weights))
        return np.minimum(np.searchsorted(np.array(edges), self._rng.random(size), side="right"), len(weights) - 1)


def render(seed: int, n_shipments: int, parcels_per_shipment: tuple[int, int], frames_per_parcel: int,
           image_size: int, label_noise: float) -> Rendered:
    d = _Draw(seed)
    size, half = image_size, image_size // 2
    s = size / 32.0  # geometry below is designed at 32 px and scaled
    # Shipments: how many parcels, and what they share.
    counts = d.integers(parcels_per_shipment[0], parcels_per_shipment[1], n_shipments)
    ship_tone = d.uniform(0.52, 0.68, n_shipments)
    ship_tape = d.uniform(0.0, 1.0, n_shipments) < 0.6
    ship_belt = d.uniform(0.14, 0.24, n_shipments)
    ship_rough = d.uniform(0.20, 0.70, n_shipments)  # chance a parcel of this shipment is damaged
    # Parcels.
    n_parcels = int(counts.sum())
    ship = np.repeat(np.arange(n_shipments), counts)
    camera = d.categorical(_CAMERA_WEIGHTS, n_parcels)
    damaged = d.uniform(0.0, 1.0, n_parcels) < ship_rough[ship]
    damage = np.where(damaged, 1 + d.categorical(_DAMAGE_WEIGHTS, n_parcels), NONE)
    flipped = d.uniform(0.0, 1.0, n_parcels) < label_noise  # an annotator's mistake, per parcel
    review = (damage != NONE) ^ flipped
    hw = d.integers(round(9 * s), round(12 * s), n_parcels)
    hh = d.integers(round(8 * s), round(11 * s), n_parcels)  # half width / height, px
    tone = ship_tone[ship] + d.uniform(-0.04, 0.04, n_parcels)
    tear_y = d.uniform(-0.6, 0.6, n_parcels) * hh
    tear_len = d.uniform(0.75, 1.0, n_parcels) * 2 * hw
    tear_walk = np.cumsum(0.5 * d.normal((n_parcels, size)), axis=1)  # cumsum along a row: fixed order
    wet_x, wet_y = d.uniform(-0.5, 0.5, n_parcels) * hw, d.uniform(-0.5, 0.5, n_parcels) * hh
    wet_sigma, wet_depth = d.uniform(3.5, 5.5, n_parcels) * s, d.uniform(0.35, 0.50, n_parcels)
    hole_x, hole_y = d.uniform(-0.6, 0.6, n_parcels) * hw, d.uniform(-0.6, 0.6, n_parcels) * hh
    hole_r = d.uniform(1.3, 2.0, n_parcels) * s
    corner, dent = d.integers(0, 3, n_parcels), d.uniform(3.0, 4.5, n_parcels) * s
    # Frames: a parcel seen from slightly shifted poses under slightly different light.
    n = n_parcels * frames_per_parcel
    p = np.repeat(np.arange(n_parcels), frames_per_parcel)
    shift = round(1 * s)
    jx, jy = d.integers(-shift, shift, n), d.integers(-shift, shift, n)
    light = d.uniform(0.93, 1.07, n)
    noise = d.normal((n, size, size))

    def col(v):  # per-frame value of a per-parcel array, shaped to broadcast over pixels
        return v[p][:, None, None]

    X = np.arange(size)[None, None, :]
    Y = np.arange(size)[None, :, None]
    rx, ry = X - (half + jx)[:, None, None], Y - (half + jy)[:, None, None]
    bw, bh, kind = col(hw), col(hh), col(damage)
    inside = (rx >= -bw) & (rx < bw) & (ry >= -bh) & (ry < bh)
    edge = inside & ((rx == -bw) | (rx == bw - 1) | (ry == -bh) | (ry == bh - 1))
    belt = ship_belt[ship][p][:, None, None] + 0.04 * (Y / size - 0.5)
    box = col(tone) + np.where(col(ship_tape[ship]) & (np.abs(ry + 0.5) < 1.5), 0.12, 0.0)
    img = np.where(inside, np.where(edge, col(tone) - 0.15, box), belt)

    # torn: the gap follows the parcel's random walk, indexed by box column
    idx = np.clip(X - jx[:, None, None], 0, size - 1)  # (N, 1, W): box column of each pixel column
    line = col(tear_y) + np.take_along_axis(tear_walk[p][:, None, :], idx, axis=2)
    along = (rx >= -bw) & (rx < -bw + col(tear_len))
    tear = (kind == TORN) & inside & along & ~edge
    img = np.where(tear & (np.abs(ry - line) < 1.1), 0.06, img)
    img = np.where(tear & (ry - line >= -2.1) & (ry - line < -1.1), img + 0.10, img)
    # wet: a soft darker blotch
    g = np.exp(-((rx - col(wet_x)) ** 2 + (ry - col(wet_y)) ** 2) / (2.0 * col(wet_sigma) ** 2))
    img = np.where((kind == WET) & inside, img * (1.0 - col(wet_depth) * g), img)
    # puncture: a hole and its shadow
    r2 = (rx - col(hole_x)) ** 2 + (ry - col(hole_y)) ** 2
    hole = (kind == PUNCTURE) & inside
    img = np.where(hole & (r2 > col(hole_r) ** 2) & (r2 <= (col(hole_r) + 1.2) ** 2), img - 0.12, img)
    img = np.where(hole & (r2 <= col(hole_r) ** 2), 0.04, img)
    # crushed_corner: L1 distance from the chosen corner decides shadow, crease and folded tip
    c = col(corner)
    dx = np.where(c % 2 == 1, bw - 1 - rx, rx + bw)
    dy = np.where(c >= 2, bh - 1 - ry, ry + bh)
    dist, crush = dx + dy, (kind == CRUSHED) & inside
    img = np.where(crush & (dist < col(dent)), img - 0.08, img)
    img = np.where(crush & (np.abs(dist - col(dent)) < 0.6), img - 0.06, img)
    img = np.where(crush & (dist < 0.4 * col(dent)), belt, img)

    out = np.empty_like(img)
    cam = camera[p]
    for k, (gain, offset, passes, sigma) in enumerate(_CAMERAS):
        sel = cam == k
        shot = img[sel] * (gain * light[sel])[:, None, None] + offset
        for _ in range(passes):
            shot = _blur(shot)
        out[sel] = shot + sigma * noise[sel]
    pixels = np.floor(np.clip(out, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    first_parcel = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return Rendered(
        images=pixels,
        needs_review=review[p].astype(np.uint8),
        shipment_index=ship[p],
        parcel_index=p,
        parcel_in_shipment=(np.arange(n_parcels) - first_parcel[ship])[p],
        frame=np.tile(np.arange(frames_per_parcel, dtype=np.int16), n_parcels),
        damage_type=damage[p].astype(np.uint8),
        camera_class=cam.astype(np.uint8),
    )


def _blur(a: np.ndarray) -> np.ndarray:
    """Separable [1/4, 1/2, 1/4] blur with replicated edges, on (N, H, W)."""
    v = np.pad(a, ((0, 0), (1, 1), (0, 0)), mode="edge")
    a = 0.25 * v[:, :-2] + 0.5 * v[:, 1:-1] + 0.25 * v[:, 2:]
    h = np.pad(a, ((0, 0), (0, 0), (1, 1)), mode="edge")
    return 0.25 * h[:, :, :-2] + 0.5 * h[:, :, 1:-1] + 0.25 * h[:, :, 2:]
