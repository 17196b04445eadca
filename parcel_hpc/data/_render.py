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

Time: shipments arrive in order, every six hours; each frame has a capture time. With ``drift``
(0..1), the last ``30% x drift`` of the shipments come after a switch: new lighting shows every
damage mark with its contrast reversed (bright where it was dark), and a new review policy flags
wet parcels, which were not reviewed before. A model trained on the past meets both on the next
shipments, while a split that validates on shipments from every period has trained on both: it
flatters the score. With ``reshipped``, a few parcels are shipped again in one of the next two
shipments: the same parcel (id, damage, label, box) seen again.

Determinism on any machine: every random number comes from ``Generator(PCG64(seed)).random()``
(raw 53-bit doubles, a stream numpy keeps stable); normals, integers and categorical draws are
derived here, not by numpy's distribution methods, whose algorithms may change between releases.
All arithmetic is elementwise float64 (no reductions whose order could vary) and pixels are
quantized to uint8 at the end. Times, re-shipping and drift draw from a second stream, and without
drift or re-shipping the pixels are drawn exactly as before they existed.

Must not: write files or know about HDF5 (synthetic.py does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parcel_hpc.errors import UsageError

DAMAGE_LABELS = ("none", "crushed_corner", "torn", "wet", "puncture")
CAMERA_LABELS = ("cam_a", "cam_b", "cam_c")
NONE, CRUSHED, TORN, WET, PUNCTURE = range(len(DAMAGE_LABELS))

_CAMERA_WEIGHTS = (0.40, 0.35, 0.25)
_DAMAGE_WEIGHTS = (0.18, 0.30, 0.26, 0.26)  # crushed, torn, wet, puncture, given the parcel is damaged
# Per camera: gain, offset, blur passes of [1/4, 1/2, 1/4], noise sigma (in 0..1 units).
_CAMERAS = ((1.00, 0.00, 0, 0.025), (1.12, 0.04, 1, 0.05), (0.80, -0.03, 2, 0.14))
_START_S, _SHIPMENT_EVERY_S = 1_767_225_600.0, 6 * 3600.0  # 2026-01-01 UTC; a shipment every six hours
_SWITCH = 0.3  # at drift=1, the last 30% of the shipments come after the switch (new lighting, new review policy)


@dataclass(frozen=True)
class Rendered:
    images: np.ndarray  # (N, size, size) uint8
    needs_review: np.ndarray  # (N,) uint8 0/1
    shipment_index: np.ndarray  # (N,) int64
    parcel_index: np.ndarray  # (N,) int64, global parcel number
    parcel_in_shipment: np.ndarray  # (N,) int64
    identity: np.ndarray  # (N,) int64, the global parcel number whose id a frame carries (a re-shipped parcel's first)
    capture_time: np.ndarray  # (N,) float64 seconds since the epoch
    frame: np.ndarray  # (N,) int16
    damage_type: np.ndarray  # (N,) uint8 codes into DAMAGE_LABELS
    camera_class: np.ndarray  # (N,) uint8 codes into CAMERA_LABELS


class _Draw:
    """Every draw derived from raw uniform doubles (see the module docstring for why)."""

    def __init__(self, seed: int | list[int]) -> None:
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


def render(
    seed: int,
    n_shipments: int,
    parcels_per_shipment: tuple[int, int],
    frames_per_parcel: int,
    image_size: int,
    label_noise: float,
    reshipped: int = 0,
    drift: float = 0.0,
) -> Rendered:
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
    when = np.arange(n_shipments) / max(1, n_shipments - 1)  # 0 for the first shipment .. 1 for the last
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
    first_parcel = np.concatenate(([0], np.cumsum(counts)[:-1]))
    extra = _Draw([seed, 1])  # a second stream: the draws above and below stay what they were
    ship_start = _START_S + _SHIPMENT_EVERY_S * np.arange(n_shipments) + extra.uniform(0.0, 3600.0, n_shipments)
    identity = _reship(extra, ship, counts, first_parcel, reshipped)
    switched = when[ship] >= 1.0 - _SWITCH * drift if drift else np.zeros(n_parcels, dtype=bool)  # per parcel
    review = np.where((damage == WET) & ~switched, flipped, review) if drift else review  # the old policy: wet is not reviewed
    if reshipped:  # the slot shows the first shipment's parcel again: its box, damage and label
        damage, review, hw, hh, tone, tear_y, tear_len, tear_walk = (a[identity] for a in (damage, review, hw, hh, tone, tear_y, tear_len, tear_walk))
        wet_x, wet_y, wet_sigma, wet_depth, hole_x, hole_y, hole_r, corner, dent = (
            a[identity] for a in (wet_x, wet_y, wet_sigma, wet_depth, hole_x, hole_y, hole_r, corner, dent)
        )
    # Frames: a parcel seen from slightly shifted poses under slightly different light.
    n = n_parcels * frames_per_parcel
    p = np.repeat(np.arange(n_parcels), frames_per_parcel)
    shift = round(1 * s)
    jx, jy = d.integers(-shift, shift, n), d.integers(-shift, shift, n)
    light = d.uniform(0.93, 1.07, n)
    noise = d.normal((n, size, size))
    frame_no = np.tile(np.arange(frames_per_parcel, dtype=np.int16), n_parcels)
    capture = ship_start[ship][p] + 60.0 * (np.arange(n_parcels) - first_parcel[ship])[p] + 2.0 * frame_no

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
    # Which way a damage mark's contrast goes: reversed under the new lighting; without drift, the same arithmetic as before.
    glare = col(np.where(switched, -1.0, 1.0)) if drift else None

    def shade(img, mask, delta):
        return np.where(mask, img + (delta if glare is None else glare * delta), img)

    def paint(img, mask, value):
        return np.where(mask, value if glare is None else img + glare * (value - img), img)

    # torn: the gap follows the parcel's random walk, indexed by box column
    idx = np.clip(X - jx[:, None, None], 0, size - 1)  # (N, 1, W): box column of each pixel column
    line = col(tear_y) + np.take_along_axis(tear_walk[p][:, None, :], idx, axis=2)
    along = (rx >= -bw) & (rx < -bw + col(tear_len))
    tear = (kind == TORN) & inside & along & ~edge
    img = paint(img, tear & (np.abs(ry - line) < 1.1), 0.06)
    img = shade(img, tear & (ry - line >= -2.1) & (ry - line < -1.1), 0.10)
    # wet: a soft darker blotch
    g = np.exp(-((rx - col(wet_x)) ** 2 + (ry - col(wet_y)) ** 2) / (2.0 * col(wet_sigma) ** 2))
    depth = col(wet_depth) if glare is None else glare * col(wet_depth)
    img = np.where((kind == WET) & inside, img * (1.0 - depth * g), img)
    # puncture: a hole and its shadow
    r2 = (rx - col(hole_x)) ** 2 + (ry - col(hole_y)) ** 2
    hole = (kind == PUNCTURE) & inside
    img = shade(img, hole & (r2 > col(hole_r) ** 2) & (r2 <= (col(hole_r) + 1.2) ** 2), -0.12)
    img = paint(img, hole & (r2 <= col(hole_r) ** 2), 0.04)
    # crushed_corner: L1 distance from the chosen corner decides shadow, crease and folded tip
    c = col(corner)
    dx = np.where(c % 2 == 1, bw - 1 - rx, rx + bw)
    dy = np.where(c >= 2, bh - 1 - ry, ry + bh)
    dist, crush = dx + dy, (kind == CRUSHED) & inside
    img = shade(img, crush & (dist < col(dent)), -0.08)
    img = shade(img, crush & (np.abs(dist - col(dent)) < 0.6), -0.06)
    img = paint(img, crush & (dist < 0.4 * col(dent)), belt)

    out = np.empty_like(img)
    cam = camera[p]
    for k, (gain, offset, passes, sigma) in enumerate(_CAMERAS):
        sel = cam == k
        shot = img[sel] * (gain * light[sel])[:, None, None] + offset
        for _ in range(passes):
            shot = _blur(shot)
        out[sel] = shot + sigma * noise[sel]
    pixels = np.floor(np.clip(out, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return Rendered(
        images=pixels,
        needs_review=review[p].astype(np.uint8),
        shipment_index=ship[p],
        parcel_index=p,
        parcel_in_shipment=(np.arange(n_parcels) - first_parcel[ship])[p],
        identity=identity[p],
        capture_time=capture,
        frame=frame_no,
        damage_type=damage[p].astype(np.uint8),
        camera_class=cam.astype(np.uint8),
    )


def _reship(d: _Draw, ship: np.ndarray, counts: np.ndarray, first_parcel: np.ndarray, k: int) -> np.ndarray:
    """Each parcel slot's identity: its own number, or for ``k`` slots that of a parcel from one or
    two shipments before (a parcel never re-shipped twice, a slot never both original and copy)."""
    identity = np.arange(len(ship))
    order = np.argsort(d.uniform(0.0, 1.0, len(ship)), kind="stable")
    gap, pick = d.integers(1, 2, len(ship)), d.uniform(0.0, 1.0, len(ship))
    used = np.zeros(len(ship), dtype=bool)
    done, last = 0, len(counts) - 1
    for orig in order.tolist():
        if done == k:
            break
        target = min(int(ship[orig] + gap[orig]), last)
        free = [q for q in range(first_parcel[target], first_parcel[target] + counts[target]) if not used[q]]
        if used[orig] or target == ship[orig] or not free:
            continue
        slot = free[min(int(pick[orig] * len(free)), len(free) - 1)]
        identity[slot] = orig
        used[orig] = used[slot] = True
        done += 1
    if done < k:
        raise UsageError(f"reshipped={k}: only {done} parcels can be shipped again in these shipments; ask for fewer or more shipments")
    return identity


def _blur(a: np.ndarray) -> np.ndarray:
    """Separable [1/4, 1/2, 1/4] blur with replicated edges, on (N, H, W)."""
    v = np.pad(a, ((0, 0), (1, 1), (0, 0)), mode="edge")
    a = 0.25 * v[:, :-2] + 0.5 * v[:, 1:-1] + 0.25 * v[:, 2:]
    h = np.pad(a, ((0, 0), (0, 0), (1, 1)), mode="edge")
    return 0.25 * h[:, :, :-2] + 0.5 * h[:, :, 1:-1] + 0.25 * h[:, :, 2:]
