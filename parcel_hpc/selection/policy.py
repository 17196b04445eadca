"""The selection policy pinned in a search's contract (``parcel_hpc/conf/selection/``), as typed values.

Checked when the contract is built (``propose.specs.build_contract``), so a malformed gate is one
line and exit 2 before anything is frozen; read back from the frozen contract by every selection
command and job (``SelectionPolicy.of``), never from a later config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import Contract

SLICE_COLUMNS = ("damage_type", "camera_class", "shipment_bucket")


@dataclass(frozen=True)
class GatePolicy:
    max_recall_drop: float
    max_miss_cost_rise: float
    min_recall: Mapping[str, float]  # slice value -> the recall the winner must reach there
    min_examples: int  # smaller slices are reported, not gated


@dataclass(frozen=True)
class SelectionPolicy:
    revision: str
    rerun_tolerance: float
    parity_tolerance: float
    baseline_name: str
    baseline_params: Mapping[str, Any]
    columns: tuple[str, ...]
    shipment_buckets: int
    gate: GatePolicy

    @classmethod
    def of(cls, contract: Contract) -> SelectionPolicy:
        """The policy a frozen contract pins (checked again: the contract file is read back)."""
        if "selection" not in contract.fields:
            raise UsageError("this search froze before selection was pinned in its contract; select from a search revision launched with this parcel_hpc")
        return cls.from_mapping(contract["selection"])

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> SelectionPolicy:
        """Validate the ``selection`` group. The baseline's params go to the trainer as a trial's
        would (a trainer may take parameters the space does not sweep); one it refuses fails the
        rerun job, and ``select`` shows its error."""
        try:
            slices, gate, baseline = m["slices"], m["gate"], m["baseline"]
            policy = cls(
                revision=str(m["revision"]),
                rerun_tolerance=_non_negative("selection.rerun_tolerance", m["rerun_tolerance"]),
                parity_tolerance=_non_negative("selection.parity_tolerance", m["parity_tolerance"]),
                baseline_name=str(baseline["name"]),
                baseline_params=dict(baseline["params"]),
                columns=tuple(slices["columns"]),
                shipment_buckets=int(slices["shipment_buckets"]),
                gate=GatePolicy(
                    max_recall_drop=_non_negative("selection.gate.max_recall_drop", gate["max_recall_drop"]),
                    max_miss_cost_rise=_non_negative("selection.gate.max_miss_cost_rise", gate["max_miss_cost_rise"]),
                    min_recall={str(k): _fraction(f"selection.gate.min_recall.{k}", v) for k, v in dict(gate["min_recall"]).items()},
                    min_examples=int(slices["min_examples"]),
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(
                f"the selection group lacks or mistypes {exc}; see parcel_hpc/conf/selection/gate_r1.yaml (or `python -m parcel_hpc.launch --cfg job`) for every key"
            ) from None
        unknown = [c for c in policy.columns if c not in SLICE_COLUMNS]
        if unknown or not policy.columns:
            raise UsageError(f"selection.slices.columns={list(policy.columns)} is not a non-empty subset of {list(SLICE_COLUMNS)}; name those columns")
        if policy.shipment_buckets < 1 or policy.gate.min_examples < 1:
            raise UsageError("selection.slices.shipment_buckets and min_examples must be >= 1")
        if not policy.baseline_name.strip():
            raise UsageError("selection.baseline.name is empty; name the approved baseline model")
        for name, value in policy.baseline_params.items():
            if not isinstance(value, (int, float, str)) or (isinstance(value, float) and not math.isfinite(value)):
                raise UsageError(f"selection.baseline.params.{name}={value!r} is not a value a trial could take; give a finite number or a string")
        return policy


def _non_negative(name: str, value: Any) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise UsageError(f"{name}={value!r} must be a finite number >= 0")
    return v


def _fraction(name: str, value: Any) -> float:
    v = _non_negative(name, value)
    if v > 1:
        raise UsageError(f"{name}={value!r} is a recall: give a number in [0, 1]")
    return v
