"""Where the worker runs: scheduler facts read once from the environment, then passed around."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from parcel_hpc.ledger import Cause, Started
from parcel_hpc.scheduler.base import Backend
from parcel_hpc.scheduler.registry import BACKENDS, backend_of
from parcel_hpc.worker.gang import GangEnv


def facts_from_env(env: Mapping[str, str] | None = None, gang: GangEnv | None = None) -> Started:
    """The facts an attempt's ``started`` event records (the only place that reads them): the first
    backend whose job this environment is says them (``registry.BACKENDS``). A gang's rank 0 sees its
    node, or its own share of the GPUs only: the attempt's allocation is every rank's, which the
    scheduler granted as asked (not said: the request stands)."""
    env = os.environ if env is None else env
    host, pid, begun = socket.gethostname(), os.getpid(), process_started()
    facts = next(facts for b in BACKENDS if (facts := b.started(env, host, pid, begun)) is not None)
    return replace(facts, gpus=None) if gang is not None else facts


def backend_of_job(env: Mapping[str, str]) -> Backend:
    """The backend whose job this environment is (the first that says its facts, as ``facts_from_env``)."""
    return next(b for b in BACKENDS if b.started(env, "", 1, None) is not None)


def process_started(proc: str = "/proc") -> float | None:
    """When this process started (epoch seconds, to the kernel's boot-time second), from /proc; None
    where there is no /proc. The job's start-up (interpreter, imports, unpickling) runs from here to
    its first attempt: spent, though no attempt's."""
    try:
        stat = Path(proc, "self", "stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime; the command name may hold spaces
        boot = next(int(line.split()[1]) for line in Path(proc, "stat").read_text().splitlines() if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def signal_cause(facts: Started) -> Cause:
    """Preemption or time limit? submitit counts every early signal as a timeout; ask the job's scheduler."""
    return backend_of(facts.executor).signal_cause(facts)


def gang_of_job() -> GangEnv | None:
    """This task's place in its trial's gang, from submitit's job environment (each backend's names
    for rank, node and hosts); None for a job of one task, or a task run outside submitit."""
    import submitit  # a worker has it loaded already; read commands import this module too

    try:
        job = submitit.JobEnvironment()
    except RuntimeError:  # not a submitit job: a task run by hand
        return None
    if job.num_tasks <= 1:
        return None
    per_node = job.num_tasks // max(1, job.num_nodes)
    hosts = list(job.hostnames)
    first = backend_of_job(os.environ).node_address(hosts[0])  # rank 0's host, as the other nodes reach it
    return GangEnv.of_job(job.raw_job_id, job.global_rank, job.num_tasks, job.local_rank, per_node, [first, *hosts[1:]])


def enter_gang(gpus_per_rank: int) -> GangEnv | None:
    """This task's gang (None: a job of one task), its place set in the environment before any trainer
    code is imported (what torch.distributed's ``env://`` reads) and its own share of the GPUs."""
    gang = gang_of_job()
    if gang is not None:
        os.environ.update(gang.environ())
        if (share := gang.devices(os.environ.get("CUDA_VISIBLE_DEVICES", ""), gpus_per_rank)) is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = share
    return gang
