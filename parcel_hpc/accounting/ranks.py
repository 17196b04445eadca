"""A gang's hours per node and per rank (issue 50): the scheduler's allocation of each run, split
the way srun laid the ranks out.

A trial of ``nodes`` x ``tasks_per_node`` ranks is one job; the scheduler accounts its allocation as
one run (``reconcile.AttemptLine``: sacct's AllocTRES x Elapsed), and its ranks, started together by one srun,
end together. srun's default (block) distribution puts ranks 0..k-1 on the allocation's first node,
the next k on the second, each rank with its own GPUs and CPUs: so each rank's share of a run is an
equal part of it, and a node's is its ranks'. The parts add up to the run (sacct's own figure): no
hour is counted twice or lost. What each rank used of its GPUs is its own worker's NVML reading
(``DeviceUse.rank_utilization``, told to rank 0 as each rank's run ended): used = the rank's GPU-hours
x its utilization, idle the rest; a rank that told none is unread, neither used nor idle. What the
ranks used of their CPUs is the scheduler's measure of the srun step they ran as (``step_lines``):
every task's CPU time and memory together, and the busiest task (rank) with its node; the scheduler
keeps no other task's figure.

Must not: read the scheduler or the ledger (its lines, the node names and the readings are handed in).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from parcel_hpc.accounting.spend import GpuUse
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import DeviceUse
from parcel_hpc.scheduler.runs import SECONDS_PER_HOUR, StepUsage


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
    def end(self) -> int | None: ...
    @property
    def gpus(self) -> int: ...
    @property
    def cpus(self) -> int: ...
    @property
    def gpu_hours(self) -> float: ...
    @property
    def cpu_hours(self) -> float: ...
    @property
    def ledger_attempt(self) -> int | None: ...


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
    device: str = ""  # the rank's GPUs as its worker named them ("" where none was read)
    gpu_utilization: float | None = None  # its mean NVML reading (None: none)
    gpu_hours_used: float | None = None  # its GPU-hours x that reading (None: unread, never 0)
    gpu_hours_idle: float | None = None


def rank_lines(
    lines: Iterable[RunLine],
    shape: TrialShape,
    node_names: Callable[[str], Sequence[str]],
    uses: Mapping[tuple[str, int], DeviceUse] | None = None,
) -> tuple[RankLine, ...]:
    """Every rank's share of every run of the trials' jobs (none for a trial of one rank). ``node_names``:
    the scheduler's node list of a run (``n[1-2]``) as names, in its order; ``uses``: (trial, attempt)
    -> what that attempt's ranks read of their GPUs, as the ledger holds it."""
    if not shape.is_gang:
        return ()
    out = []
    for line in lines:
        if not line.trial_id or line.start is None:
            continue  # an orphan, or a run that never started: no rank ran
        names = list(node_names(line.node))
        use = (uses or {}).get((line.trial_id, line.ledger_attempt)) if line.ledger_attempt is not None else None
        for rank in range(shape.ranks):
            index = rank // shape.tasks_per_node
            node = names[index] if len(names) == shape.nodes else line.node  # another layout than the shape's: the run's list
            gpu_hours = line.gpu_hours / shape.ranks
            own = use.of_rank(rank) if use is not None else None
            used, idle = GpuUse.of(gpu_hours, own).columns()
            out.append(
                RankLine(
                    line.trial_id,
                    line.job_id,
                    line.run,
                    rank,
                    node,
                    line.gpus // shape.ranks,
                    line.cpus // shape.ranks,
                    gpu_hours,
                    line.cpu_hours / shape.ranks,
                    ",".join(own.devices) if own is not None else "",
                    own.utilization if own is not None else None,
                    used,
                    idle,
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


@dataclass(frozen=True)
class StepLine:
    """One srun step of a gang's run (its ranks the step's tasks), as the scheduler measured it."""

    trials: str  # the trials the run ran ("t0003"; a slot's, in turn: "t0000,t0002")
    job_id: str
    run: int
    step: str
    nodes: int
    ranks: int  # the step's tasks
    node_list: str
    elapsed_s: int
    cpu_hours_used: float | None  # every rank's CPU time (None: not measured)
    cpu_use: float | None  # that over the run's allocated CPU-hours (seff's "CPU efficiency")
    memory_bytes: int | None  # every rank's memory together
    busiest_rank: int | None  # the rank that used the most CPU time, on ``busiest_node``
    busiest_node: str
    busiest_cpu_hours: float | None


def step_lines(lines: Iterable[RunLine], steps: Iterable[StepUsage]) -> tuple[StepLine, ...]:
    """Each measured step beside the run of a trial's job it ran in: a run's lines together (a slot's
    run holds several trials' attempts, and its own start-up and gaps), its allocated CPU-hours theirs
    summed. Steps of runs no trial's line shows (an orphan's) are left out."""
    steps = list(steps)  # read once per run
    runs: dict[tuple[str, int], list[RunLine]] = {}
    for line in lines:
        if line.start is not None:
            runs.setdefault((line.job_id, line.run), []).append(line)
    out = []
    for (job_id, run), parts in runs.items():
        trials = ",".join(sorted({p.trial_id for p in parts if p.trial_id}))
        if not trials:
            continue
        start = min(p.start for p in parts if p.start is not None)
        end = None if any(p.end is None for p in parts) else max(p.end for p in parts if p.end is not None)
        allocated = sum(p.cpu_hours for p in parts)
        for s in (s for s in steps if s.ran_in(job_id, start, end)):
            used = s.cpu_s / SECONDS_PER_HOUR if s.cpu_s is not None else None
            out.append(
                StepLine(
                    trials,
                    job_id,
                    run,
                    s.step,
                    s.nodes,
                    s.tasks,
                    s.node_list,
                    s.elapsed_s,
                    used,
                    used / allocated if used is not None and allocated > 0 else None,
                    s.memory_bytes,
                    s.busiest_task,
                    s.busiest_node,
                    s.busiest_cpu_s / SECONDS_PER_HOUR if s.busiest_cpu_s is not None else None,
                )
            )
    return tuple(out)
