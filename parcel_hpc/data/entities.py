"""Entities a split must never cut apart, and the leak of a partitioning that does.

Owns the rule that frames sharing a shipment, a parcel, or a value of any group column the snapshot
declares belong together: their connected components (union-find over the frames' entity values; a
parcel shipped twice joins its two shipments into one component). Owns the pure check that names the
first entity whose frames lie in more than one partition, and the one way a leak is grouped away
(a crossing component moves whole into the latest of its partitions, so training only ever shrinks).

Must not: choose partitions (split.py, periods.py) or write files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import h5py
import numpy as np

from parcel_hpc.data.schema import CAPTURE_TIME, PARCEL_ID, SHIPMENT_ID, inspect_structure

Column = Sequence[str] | np.ndarray  # one id per frame


@dataclass(frozen=True)
class Entities:
    """The entity columns of a snapshot, one value per frame: shipment first, then parcel, then the
    declared group columns; and the capture times when the snapshot has them."""

    columns: tuple[tuple[str, np.ndarray], ...]  # (dataset name, str values per frame)
    capture_time: np.ndarray | None  # float64 seconds per frame

    @property
    def shipments(self) -> np.ndarray:
        return self.columns[0][1]

    def together(self) -> dict[str, str]:
        """Each shipment's component, named by its smallest shipment id."""
        return shipment_components(self.shipments, [values for _, values in self.columns[1:]])


@dataclass(frozen=True)
class Leak:
    """An entity whose frames lie in more than one partition."""

    column: str  # the dataset that names it: shipment_id, parcel_id or a declared group column
    value: str
    parts: tuple[str, ...]  # the partitions its frames lie in, in the partitioning's order

    def __str__(self) -> str:
        return f"{self.column} {self.value!r} lies in {' and '.join(self.parts)}"


def read_entities(f: h5py.File) -> Entities:
    meta = inspect_structure(f)
    names = (SHIPMENT_ID, PARCEL_ID, *meta.group_columns)
    columns = tuple((name, np.char.decode(f[name][:], "ascii")) for name in names)
    times = f[CAPTURE_TIME][:].astype(np.float64) if meta.has_capture_time else None
    return Entities(columns=columns, capture_time=times)


def components(columns: Sequence[Column]) -> np.ndarray:
    """Per frame, the number of its connected component (numbered by first appearance): two frames
    are connected when they share a value in any one column."""
    if not columns or not len(columns[0]):
        return np.zeros(0, dtype=np.int64)
    # Union-find over the distinct combinations only: a snapshot has far fewer than frames.
    combos, first_seen, inverse = np.unique(np.stack([np.asarray(c, dtype=str) for c in columns]), axis=1, return_index=True, return_inverse=True)
    parent: dict[tuple[int, str], tuple[int, str]] = {}

    def find(node: tuple[int, str]) -> tuple[int, str]:
        root = node
        while parent[root] != root:
            root = parent[root]
        while parent[node] != root:  # path compression: later finds are short
            parent[node], node = root, parent[node]
        return root

    for row in combos.T.tolist():
        nodes = [(c, value) for c, value in enumerate(row)]
        for node in nodes:
            parent.setdefault(node, node)
        first = find(nodes[0])
        for node in nodes[1:]:
            other = find(node)
            if other != first:
                parent[other] = first
    roots = [find((0, value)) for value in combos[0].tolist()]
    numbers: dict[tuple[int, str], int] = {}
    for i in np.argsort(first_seen, kind="stable").tolist():  # numbered by the first frame that shows them
        numbers.setdefault(roots[i], len(numbers))
    return np.asarray([numbers[roots[i]] for i in range(len(roots))], dtype=np.int64)[inverse.reshape(-1)]


def shipment_components(shipments: Column, others: Sequence[Column]) -> dict[str, str]:
    """Each shipment's component (the shipments joined to it through the other columns), named by
    its smallest shipment id."""
    comp = components([shipments, *others])
    name: dict[int, str] = {}
    for s, c in zip(list(shipments), comp.tolist()):
        name[c] = min(name.get(c, s), s)
    return {s: name[c] for s, c in zip(list(shipments), comp.tolist())}


def find_leak(columns: Sequence[tuple[str, Column]], part: Sequence[int], names: Sequence[str]) -> Leak | None:
    """The first entity (by column, then value) whose frames lie in more than one partition.

    ``part`` gives each frame's partition as an index into ``names``; a frame in no partition has -1
    and is not counted."""
    labels = np.asarray(part, dtype=np.int64)
    kept = labels >= 0
    for column, values in columns:
        v, lab = np.asarray(values)[kept], labels[kept]
        if not len(v):
            continue
        keys, inverse = np.unique(v, return_inverse=True)
        pairs = np.unique(np.stack([inverse, lab]), axis=1)
        spread = np.bincount(pairs[0], minlength=len(keys))
        if (spread > 1).any():
            k = int(np.argmax(spread > 1))
            parts = sorted(set(pairs[1][pairs[0] == k].tolist()))
            return Leak(column, str(keys[k]), tuple(names[p] for p in parts))
    return None


def group_leaks_away(assignment: Mapping[str, int], together: Mapping[str, str]) -> dict[str, int]:
    """Each component moved whole into the latest partition (highest index) any of its shipments is
    in: a leak grouped away never adds a frame to an earlier (training) partition."""
    latest: dict[str, int] = {}
    for shipment, index in assignment.items():
        rep = together[shipment]
        latest[rep] = max(latest.get(rep, index), index)
    return {shipment: latest[together[shipment]] for shipment in assignment}
