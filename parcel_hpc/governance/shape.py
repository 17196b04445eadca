"""A trial's shape: how many processes (ranks) one trial runs as, on how many nodes, each granted what.

``resources.nodes`` x ``resources.tasks_per_node`` ranks, each with ``resources.gpus`` GPUs and
``resources.cpus`` CPUs; a trial of one rank (the default) is what every search ran before gangs. The
worst case a launch admits and an attempt reserves, the TRES an association limit is checked
against and the GPUs an attempt is charged for are the whole gang's: ``gpus`` and ``cpus`` here are
the trial's totals. A one-rank shape pins nothing new in the contract, so a search frozen before gangs
keeps its digest; a gang pins its nodes and tasks per node.

Must not: read a configuration beyond the resources mapping it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
