"""The selection policy pinned in a search's contract (``parcel_hpc/conf/selection/``), as typed values.

Checked when the contract is built (``propose.specs.build_contract`` calls ``pinned_selection``), so
a malformed gate or baseline is one line and exit 2 before anything is frozen; read back from the
frozen contract by every selection command and job (``SelectionPolicy.of``), never from a later config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import Contract
from parcel_hpc.selection.baseline import Baseline, BaselineKind, resolve
from parcel_hpc.trainer import trainer_identity

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
    performance_margin: float  # validation: the winner's miss-cost may exceed the baseline's by at most this
    final_performance_margin: float | None  # the same on the final partition; None: reported, decides nothing
    baseline: Baseline
    columns: tuple[str, ...]
    shipment_buckets: int
    gate: GatePolicy

    def describe(self) -> str:
        """One line for the launch: what the winner will be held to, on validation at select and on the final partition."""
        final = (
            "reported, it decides nothing"
            if self.final_performance_margin is None
            else f"at most {self.final_performance_margin:g} above the baseline's miss-cost (else hold:final-performance)"
        )
        return (
            f"the winner is held to at most {self.performance_margin:g} above the baseline's validation miss-cost and to the slice gate "
            f"at select, before the final partition is read; the final result: {final}"
        )

    @classmethod
    def of(cls, contract: Contract) -> SelectionPolicy:
        """The policy a frozen contract pins (checked again: the contract file is read back)."""
        if "selection" not in contract.fields:
            raise UsageError("this search froze before selection was pinned in its contract; select from a search revision launched with this parcel_hpc")
        return cls.from_mapping(contract["selection"], contract["trainer"])

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], search_trainer: Mapping[str, Any]) -> SelectionPolicy:
        """Validate the ``selection`` field as pinned (``pinned_selection``); ``search_trainer``: the
        contract's trainer identity, the baseline's when it pins none of its own."""
        try:
            slices, gate = m["slices"], m["gate"]
            policy = cls(
                revision=str(m["revision"]),
                rerun_tolerance=_non_negative("selection.rerun_tolerance", m["rerun_tolerance"]),
                parity_tolerance=_non_negative("selection.parity_tolerance", m["parity_tolerance"]),
                # A contract frozen before these were pinned held the winner to the baseline exactly, at release.
                performance_margin=_non_negative("selection.performance_margin", m.get("performance_margin", 0.0)),
                final_performance_margin=None
                if m.get("final_performance_margin") is None
                else _non_negative("selection.final_performance_margin", m["final_performance_margin"]),
                baseline=Baseline.pinned(m["baseline"], search_trainer),
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
        return policy


def pinned_selection(m: Mapping[str, Any], search_trainer: Mapping[str, Any]) -> dict[str, Any]:
    """The ``selection`` group as the contract pins it: the baseline resolved (``baseline.resolve``:
    its trainer imported and its params checked, or its released artifact read), all of it checked."""
    if not isinstance(m.get("baseline"), Mapping):
        raise UsageError("the selection group lacks its baseline; pick one: selection/baseline=logreg_approved (the demo's) or selection/baseline=given")
    baseline = resolve(m["baseline"], str(search_trainer["target"]))
    if baseline.kind is BaselineKind.TRAINED and baseline.target == search_trainer["target"]:
        baseline = replace(baseline, trainer=dict(search_trainer))  # the search's own code, packages trainer.code names included
    elif search_trainer.get("code") and baseline.trainer.get("code"):
        # A baseline of your own code: the packages trainer.code names go with its copy too (one copy
        # per package's content, never two differing copies of one package in a selection job).
        baseline = replace(baseline, trainer=trainer_identity(baseline.target, search_trainer["code"]))
    pinned = {**dict(m), "baseline": baseline.to_json(search_trainer)}
    SelectionPolicy.from_mapping(pinned, search_trainer)
    return pinned


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
