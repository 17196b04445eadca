"""A trial's shape: how many processes (ranks) one trial runs as, on how many nodes, each granted what.

``resources.nodes`` x ``resources.tasks_per_node`` ranks, each with ``resources.gpus`` GPUs and
``resources.cpus`` CPUs; a trial of one rank (the default) is what every search ran before gangs. The
worst case a launch admits and an attempt reserves, the TRES an association limit is checked
against and the GPUs an attempt is charged for are the whole gang's: ``gpus`` and ``cpus`` here are
the trial's totals. A one-rank shape pins nothing new in the contract, so a search frozen before gangs
keeps its digest; a gang pins its nodes and tasks per node. A search whose trials differ in shape
(``ShapePlan``) maps one searched parameter's values to shapes; each trial's spec carries its own.

Must not: read a configuration beyond the resources mapping it is given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class TrialShape:
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_rank: int = 0
    cpus_per_rank: int = 1

    @classmethod
    def of(cls, resources: Mapping[str, Any]) -> TrialShape:
        """The shape a contract's (or a configuration's) resources give; absent nodes and tasks: one rank."""
        return cls(int(resources.get("nodes", 1)), int(resources.get("tasks_per_node", 1)), int(resources.get("gpus", 0)), int(resources.get("cpus", 1)))

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def is_gang(self) -> bool:
        return self.ranks > 1

    @property
    def gpus(self) -> int:
        """GPUs the whole trial holds."""
        return self.ranks * self.gpus_per_rank

    @property
    def cpus(self) -> int:
        """CPUs the whole trial holds."""
        return self.ranks * self.cpus_per_rank

    def pinned(self) -> dict[str, int]:
        """What the contract pins beyond gpus and cpus: nothing for one rank, the gang's layout otherwise."""
        return {"nodes": self.nodes, "tasks_per_node": self.tasks_per_node} if self.is_gang else {}

    def describe(self) -> str:
        """``1 GPU`` for one rank; ``2 nodes x 2 ranks x 1 GPU`` for a gang."""
        per = f"{self.gpus_per_rank} GPU"
        return (
            per
            if not self.is_gang
            else f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {self.tasks_per_node} rank{'s' if self.tasks_per_node > 1 else ''} x {per}"
        )


def value_key(value: Any) -> str:
    """A parameter's value as a ``resources.shapes`` key: a string as written, anything else as JSON
    (``64``, ``0.5``, ``true``), so the key a config writes and the value a trial draws compare as text."""
    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class ShapePlan:
    """Which shape each trial of a search takes: by the value of one searched parameter
    (``resources.shape_by``, ``resources.shapes``), the default shape for a value not listed. No
    ``by`` (the default): every trial the default shape, and the contract pins nothing new."""

    default: TrialShape
    by: str = ""
    shapes: Mapping[str, TrialShape] = field(default_factory=dict)  # value_key -> the shape of its trials
    base: Mapping[str, Any] = field(default_factory=dict)  # the resources it was read from: every trial's but its shape

    @classmethod
    def of(cls, resources: Mapping[str, Any]) -> ShapePlan:
        """The plan a contract's (or a checked configuration's) resources give."""
        default = TrialShape.of(resources)
        by = resources.get("shape_by") or ""
        shapes = {
            value_key(k): replace(default, nodes=int(v.get("nodes", 1)), tasks_per_node=int(v.get("tasks_per_node", 1)))
            for k, v in (resources.get("shapes") or {}).items()
        }
        return cls(default, by, shapes if by else {}, dict(resources))

    def shape_of(self, params: Mapping[str, Any]) -> TrialShape:
        """The shape of the trial with these params (a forged spec without the parameter: the default, never a KeyError)."""
        return self.shapes.get(value_key(params.get(self.by)), self.default) if self.by else self.default

    def trial_resources(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A trial's own resources: the contract's, with the mapping replaced by the trial's shape
        (pinned as a gang's is: nothing for one rank). The contract's as they are without a mapping."""
        if not self.by:
            return dict(self.base)
        own = {k: v for k, v in self.base.items() if k not in ("shape_by", "shapes", "nodes", "tasks_per_node")}
        return own | self.shape_of(params).pinned()

    def admits(self, trial_resources: Mapping[str, Any], params: Mapping[str, Any], ranks: int) -> bool:
        """Whether a trial whose spec holds ``trial_resources``, run as ``ranks`` processes, is what the
        plan gives its ``params``: a spec forged to another shape, or a job of
        another shape, would run and be charged as something the contract never admitted."""
        return dict(trial_resources) == self.trial_resources(params) and ranks == TrialShape.of(trial_resources).ranks

    def all_shapes(self) -> tuple[TrialShape, ...]:
        """Every shape a trial of the search may take, the default first."""
        return tuple(dict.fromkeys((self.default, *self.shapes.values())))

    @property
    def largest(self) -> TrialShape:
        """The shape holding most (every shape's ranks have the same GPUs and CPUs): a future proposal's worst case."""
        return max(self.all_shapes(), key=lambda s: s.ranks)

    @property
    def mixed(self) -> bool:
        return len(self.all_shapes()) > 1

    def pinned(self) -> dict[str, Any]:
        """What the contract pins for the mapping: nothing without one."""
        if not self.by:
            return {}
        return {"shape_by": self.by, "shapes": {k: {"nodes": s.nodes, "tasks_per_node": s.tasks_per_node} for k, s in sorted(self.shapes.items())}}
