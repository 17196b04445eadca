"""Time-ordered partitions: the past to train on, later shipments to validate on, the latest held out.

Owns where the time boundaries fall. The unit is a component of shipments (entities.py), never a
frame: a shipment, and every shipment joined to it by a shared parcel, lies wholly on one side of
every boundary. A boundary is clean when every frame before it is captured no later than every frame
after it; each boundary is the clean one nearest its share of shipments. So every training frame of
a period split is no later than any frame it is validated on, and the final partition is the latest.

Pure: must not read files or choose anything at random.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from parcel_hpc.errors import UsageError


def assign_periods(
    shipments: Sequence[str] | np.ndarray, times: Sequence[float] | np.ndarray, together: Mapping[str, str], fractions: Sequence[float]
) -> tuple[tuple[str, ...], ...]:
    """Cut the shipments into ``len(fractions)`` consecutive periods, earliest first, holding about
    those shares of the shipments (one id per frame in ``shipments``, its capture time in ``times``)."""
    ship = np.asarray(shipments, dtype=str)
    t = np.asarray(times, dtype=np.float64)
    units = sorted({together[s] for s in ship.tolist()})
    unit_of = np.searchsorted(units, [together[s] for s in ship.tolist()])
    lo = np.full(len(units), np.inf)
    hi = np.full(len(units), -np.inf)
    np.minimum.at(lo, unit_of, t)
    np.maximum.at(hi, unit_of, t)
    members: dict[int, set[str]] = {}
    for s, u in zip(ship.tolist(), unit_of.tolist()):
        members.setdefault(u, set()).add(s)
    order = sorted(range(len(units)), key=lambda u: (hi[u], lo[u], units[u]))  # by the time a unit was last seen
    weight = np.cumsum([len(members[u]) for u in order])  # shipments before each possible boundary
    # A boundary after position i is clean when all before it end no later than all after it begin.
    latest_before = np.maximum.accumulate(hi[order])[:-1]
    earliest_after = np.minimum.accumulate(lo[order][::-1])[::-1][1:]
    clean = (np.flatnonzero(latest_before <= earliest_after) + 1).tolist()
    cuts = _choose(clean, weight, fractions)
    bounds = [0, *cuts, len(order)]
    return tuple(tuple(sorted(s for u in order[a:b] for s in members[u])) for a, b in zip(bounds[:-1], bounds[1:]))


def kfold_fractions(k: int, final_fraction: float) -> tuple[float, ...]:
    """A forward-chaining K-fold's periods: K + 1 equal shares of the non-final shipments (the first
    only ever trained on, each later one validated once on all before it), then the final share."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise UsageError(f"split.folds={k!r} must be an integer of at least 2 (one validation fold, one to train on)")
    if not 0 < final_fraction < 1:
        raise UsageError(f"final_fraction={final_fraction!r} must lie strictly between 0 and 1")
    return (*[(1.0 - final_fraction) / (k + 1)] * (k + 1), float(final_fraction))


def _choose(clean: list[int], weight: np.ndarray, fractions: Sequence[float]) -> list[int]:
    """The clean boundary nearest each share's target, in order, leaving room for the ones after."""
    n_cuts = len(fractions) - 1
    if len(clean) < n_cuts:
        raise UsageError(
            f"the shipments overlap in time so that only {len(clean)} clean time boundaries exist and {len(fractions)} periods need {n_cuts}; "
            "use fewer periods or folds, or a group split"
        )
    targets = np.cumsum(fractions)[:-1] / sum(fractions) * weight[-1]
    before = np.asarray([weight[c - 1] for c in clean], dtype=np.float64)  # shipments before each clean boundary
    chosen: list[int] = []
    start = 0
    for j, target in enumerate(targets.tolist()):
        stop = len(clean) - (n_cuts - 1 - j)  # leave one clean boundary for each later cut
        pick = start + int(np.argmin(np.abs(before[start:stop] - target)))
        chosen.append(clean[pick])
        start = pick + 1
    return chosen
