"""Where the worker runs: scheduler facts read once from the environment, then passed around."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from parcel_hpc.ledger import Cause, Executor, Started


def facts_from_env(env: Mapping[str, str] | None = None) -> Started:
    """The facts an attempt's ``started`` event records (the only place that reads them)."""
    env = os.environ if env is None else env
    host = socket.gethostname()
    if env.get("SLURM_JOB_ID"):
        array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{array_job}_{task}" if array_job and task else env["SLURM_JOB_ID"]
        return Started(
            Executor.SLURM,
            job_id,
            env["SLURM_JOB_ID"],
            env.get("SLURMD_NODENAME", host),
            host,
            os.getpid(),
            int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            env.get("CUDA_VISIBLE_DEVICES", ""),
            _slurm_gpus(env),
            process_started(),
        )
    return Started(
        Executor.LOCAL,
        env.get("SUBMITIT_LOCAL_JOB_ID", ""),
        env.get("SUBMITIT_LOCAL_JOB_ID", ""),
        host,
        host,
        os.getpid(),
        0,
        env.get("CUDA_VISIBLE_DEVICES", ""),
        _devices(env.get("CUDA_VISIBLE_DEVICES", "")),  # the local executor sets it for each child: what it handed out
        process_started(),
    )


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


def _devices(listing: str) -> int:
    return len([d for d in listing.split(",") if d.strip()])


def _slurm_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs SLURM allocated to the job on this node (None where it does not say: the request stands)."""
    if env.get("SLURM_GPUS_ON_NODE", "").strip().isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    if env.get("SLURM_JOB_GPUS", "").strip():
        return _devices(env["SLURM_JOB_GPUS"])
    return None


def signal_cause(facts: Started) -> Cause:
    """Preemption or time limit? submitit counts every early signal as a timeout; ask the scheduler.

    On SLURM a preemption sets PreemptTime on the job (observed on 22.05); a time-limit warning leaves
    it None. Locally the only sender is the controller's timeout (or a test's interrupt).
    """
    if facts.executor is not Executor.SLURM:
        return Cause.TIMEOUT
    try:
        out = subprocess.run(["scontrol", "show", "job", facts.raw_job_id], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return Cause.TIMEOUT
    for token in out.split():
        if token.startswith("PreemptTime="):
            return Cause.TIMEOUT if token.split("=", 1)[1] in ("None", "") else Cause.PREEMPTED
    return Cause.TIMEOUT
