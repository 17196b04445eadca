"""Slice reports and the slice gate (pure): TFX's Evaluator idea, miss-cost and recall per slice
against an approved baseline, with change and value thresholds.

A slice is one value of one column: a damage type, a camera class, or a bucket of shipments
(shipments hashed into ``buckets`` groups, so a bucket is stable across runs and splits).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from parcel_hpc.governance.metric import MissCost
from parcel_hpc.selection.policy import GatePolicy

OVERALL = ("overall", "all")


def shipment_buckets(shipment_id: np.ndarray, buckets: int) -> np.ndarray:
    """``b<k>`` per example: the shipment's stable hash modulo ``buckets``."""
    names = {s: f"b{int.from_bytes(hashlib.sha256(str(s).encode()).digest()[:4], 'big') % buckets}" for s in np.unique(shipment_id)}
    return np.array([names[s] for s in shipment_id])


@dataclass(frozen=True)
class SliceRow:
    column: str
    value: str
    n: int
    positives: int
    miss_cost: float  # per frame, the pinned metric on this slice
    recall: float | None  # of needs_review; None when the slice has no positive

    def to_json(self) -> dict:
        return {"column": self.column, "value": self.value, "n": self.n, "positives": self.positives, "miss_cost": self.miss_cost, "recall": self.recall}

    @classmethod
    def from_json(cls, obj: Mapping) -> SliceRow:
        return cls(obj["column"], obj["value"], int(obj["n"]), int(obj["positives"]), float(obj["miss_cost"]), obj["recall"])


def slice_report(scores: np.ndarray, labels: np.ndarray, columns: Mapping[str, np.ndarray], metric: MissCost) -> tuple[SliceRow, ...]:
    """The overall row, then one row per (column, value), values sorted."""
    rows = [_row(*OVERALL, scores, labels, metric)]
    for column, values in columns.items():
        for value in sorted(set(values.tolist())):
            sel = values == value
            rows.append(_row(column, str(value), scores[sel], labels[sel], metric))
    return tuple(rows)


def _row(column: str, value: str, scores: np.ndarray, labels: np.ndarray, metric: MissCost) -> SliceRow:
    positive = labels.astype(bool)
    flagged = scores >= metric.threshold
    positives = int(positive.sum())
    recall = float(np.count_nonzero(positive & flagged) / positives) if positives else None
    return SliceRow(column, value, int(len(labels)), positives, metric(scores, labels), recall)


@dataclass(frozen=True)
class Finding:
    """One gate check on one slice."""

    column: str
    value: str
    check: str  # recall_drop | miss_cost_rise | min_recall
    winner: float | None  # None: a value threshold's slice is absent or has no positive
    baseline: float | None
    limit: float
    passed: bool

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("column", "value", "check", "winner", "baseline", "limit", "passed")}

    def describe(self) -> str:
        """The check in numbers: ``damage_type=crushed_corner recall_drop: winner 0.810, baseline 0.900, limit 0.05``."""
        winner = "absent" if self.winner is None else f"{self.winner:.3f}"
        baseline = "" if self.baseline is None else f", baseline {self.baseline:.3f}"
        return f"{self.column}={self.value} {self.check}: winner {winner}{baseline}, limit {self.limit:g}"


@dataclass(frozen=True)
class GateResult:
    findings: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings)

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.passed)


def slice_gate(winner: Sequence[SliceRow], baseline: Sequence[SliceRow], gate: GatePolicy) -> GateResult:
    """Every gated slice against the baseline (change thresholds) and the named slices' value thresholds."""
    base = {(r.column, r.value): r for r in baseline}
    findings = []
    # A value threshold holds only where it can be shown: a named slice that is absent (a typo, a
    # damage type the partition lacks) or has no positive fails rather than passing unseen.
    for value, limit in gate.min_recall.items():
        rows = [w for w in winner if w.value == value and w.recall is not None]
        if not rows:
            column = next((w.column for w in winner if w.value == value), "slice")
            findings.append(Finding(column, value, "min_recall", None, None, limit, False))
    for w in winner:
        if (w.column, w.value) == OVERALL:
            continue
        b = base.get((w.column, w.value))
        if w.n >= gate.min_examples and b is not None:
            # A recall is gated only over enough positives: a handful of label-noise positives is noise.
            if w.recall is not None and b.recall is not None and w.positives >= gate.min_examples:
                findings.append(
                    Finding(w.column, w.value, "recall_drop", w.recall, b.recall, gate.max_recall_drop, b.recall - w.recall <= gate.max_recall_drop + 1e-12)
                )
            findings.append(
                Finding(
                    w.column,
                    w.value,
                    "miss_cost_rise",
                    w.miss_cost,
                    b.miss_cost,
                    gate.max_miss_cost_rise,
                    w.miss_cost - b.miss_cost <= gate.max_miss_cost_rise + 1e-12,
                )
            )
        if w.value in gate.min_recall and w.recall is not None:
            limit = gate.min_recall[w.value]
            findings.append(Finding(w.column, w.value, "min_recall", w.recall, None, limit, w.recall >= limit - 1e-12))
    return GateResult(tuple(findings))


def overall(rows: Sequence[SliceRow]) -> SliceRow:
    return next(r for r in rows if (r.column, r.value) == OVERALL)
