"""A gang's hours per node and per rank (issue 50): the scheduler's allocation of each run, split
the way srun laid the ranks out.

A trial of ``nodes`` x ``tasks_per_node`` ranks is one job; the scheduler accounts its allocation as
one run (``reconcile.AttemptLine``: sacct's AllocTRES x Elapsed), and its ranks, started together by one srun,
end together. srun's default (block) distribution puts ranks 0..k-1 on the allocation's first node,
the next k on the second, each rank with its own GPUs and CPUs: so each rank's share of a run is an
equal part of it, and a node's is its ranks'. The parts add up to the run (sacct's own figure): no
hour is counted twice or lost. Per-task usage measured by the scheduler (sacct's TRESUsageIn* of a
step) is not read: it gives a step's maximum and average task, not every task.

Must not: read the scheduler or the ledger (its lines and the node names are handed in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from parcel_hpc.governance.shape import TrialShape


class RunLine(Protocol):
    """What a rank's share is taken from: a report line of one run (``reconcile.AttemptLine``)."""

    @property
    def trial_id(self) -> str: ...
    @property
    def job_id(self) -> str: ...
    @property
    def run(self) -> int: ...
    @property
    def node(self) -> str: ...
    @property
    def start(self) -> int | None: ...
    @property
    def gpus(self) -> int: ...
    @property
    def cpus(self) -> int: ...
    @property
    def gpu_hours(self) -> float: ...
    @property
    def cpu_hours(self) -> float: ...


@dataclass(frozen=True)
class RankLine:
    """One rank's share of one run of a gang's job."""

    trial_id: str
    job_id: str
    run: int  # the job's run (0, then 1 after its first requeue...)
    rank: int
    node: str
    gpus: int
    cpus: int
    gpu_hours: float
    cpu_hours: float


def rank_lines(lines: Iterable[RunLine], shape: TrialShape, node_names: Callable[[str], Sequence[str]]) -> tuple[RankLine, ...]:
    """Every rank's share of every run of the trials' jobs (none for a trial of one rank). ``node_names``:
    the scheduler's node list of a run (``n[1-2]``) as names, in its order."""
    if not shape.is_gang:
        return ()
    out = []
    for line in lines:
        if not line.trial_id or line.start is None:
            continue  # an orphan, or a run that never started: no rank ran
        names = list(node_names(line.node))
        for rank in range(shape.ranks):
            index = rank // shape.tasks_per_node
            node = names[index] if len(names) == shape.nodes else line.node  # another layout than the shape's: the run's list
            out.append(
                RankLine(
                    line.trial_id,
                    line.job_id,
                    line.run,
                    rank,
                    node,
                    line.gpus // shape.ranks,
                    line.cpus // shape.ranks,
                    line.gpu_hours / shape.ranks,
                    line.cpu_hours / shape.ranks,
                )
            )
    return tuple(out)


def node_hours(ranks: Iterable[RankLine]) -> dict[tuple[str, str, int, str], tuple[float, float]]:
    """(trial, job, run, node) -> its ranks' (GPU-hours, CPU-hours)."""
    out: dict[tuple[str, str, int, str], tuple[float, float]] = {}
    for r in ranks:
        gpu, cpu = out.get((r.trial_id, r.job_id, r.run, r.node), (0.0, 0.0))
        out[(r.trial_id, r.job_id, r.run, r.node)] = (gpu + r.gpu_hours, cpu + r.cpu_hours)
    return out
