"""Talking to SLURM outside submitit: is it reachable, which of our jobs are alive, what ended how.

Shell-outs build an argv (pure) and a separate pure function parses the text; the runners raise
SchedulerUnavailable with one line naming the problem and the fix, never a partial answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import SchedulerUnavailable, UsageError

SQUEUE_FORMAT = "%i|%T|%r|%N"


@dataclass(frozen=True)
class QueuedJob:
    job_id: str  # "123" or "123_4"
    state: str  # PENDING, RUNNING, REQUEUED, ...
    reason: str
    nodes: str


def check_reachable(env: Mapping[str, str] | None = None, timeout: float = 15.0) -> None:
    """Raise SchedulerUnavailable unless a SLURM controller answers."""
    env = dict(os.environ if env is None else env)
    if shutil.which("sbatch", path=env.get("PATH")) is None:
        raise SchedulerUnavailable("sbatch is not on PATH: this machine has no SLURM client; install slurm-client, or use hydra/launcher=submitit_local")
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if not os.path.exists(conf):
        raise SchedulerUnavailable(
            f"SLURM is not configured here ({'SLURM_CONF=' + env['SLURM_CONF'] if env.get('SLURM_CONF') else 'no SLURM_CONF and no /etc/slurm/slurm.conf'}); source the cluster's env file (scripts/dev-cluster-up.sh prints it) or use hydra/launcher=submitit_local"
        )
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=timeout)
        reply = (proc.stdout or proc.stderr).strip()
    except subprocess.TimeoutExpired:
        proc, reply = None, f"no reply within {timeout:.0f}s"
    if proc is None or proc.returncode != 0 or " is UP" not in reply:
        first = reply.splitlines()[0] if reply else "no reply"
        raise SchedulerUnavailable(f"slurmctld is not answering ({first}); start it (scripts/dev-cluster-up.sh for the dev cluster) or ask your admin")


@dataclass(frozen=True)
class ControllerLimits:
    """What the controller accepts, read from it (sites change both in slurm.conf)."""

    max_array_size: int  # tasks per array: indices 0..MaxArraySize-1
    max_job_count: int  # jobs the controller holds at once, every user's together


DEFAULT_LIMITS = ControllerLimits(1001, 10000)  # SLURM's defaults, where the configuration omits them


def parse_config(text: str) -> ControllerLimits:
    """``scontrol show config``'s ``Name = value`` lines -> the limits (pure)."""
    values = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name.strip()] = value.strip()

    def whole(name: str, default: int) -> int:
        value = values.get(name, "")
        return int(value) if value.isdigit() and int(value) > 0 else default

    return ControllerLimits(whole("MaxArraySize", DEFAULT_LIMITS.max_array_size), whole("MaxJobCount", DEFAULT_LIMITS.max_job_count))


def controller_limits(env: Mapping[str, str] | None = None) -> ControllerLimits:
    return parse_config(_run(["scontrol", "show", "config"], env, 30.0))


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    max_minutes: float | None  # None: UNLIMITED / INFINITE


def parse_partitions(text: str) -> list[Partition]:
    """``scontrol show partition``'s records -> name, Default and MaxTime (pure)."""
    from .validation import time_min  # SLURM's time forms, parsed in one place

    out = []
    for record in text.split("PartitionName=")[1:]:
        fields = dict(token.split("=", 1) for token in record.split() if "=" in token)
        name = record.split()[0] if record.split() else ""
        max_time = fields.get("MaxTime", "UNLIMITED")
        try:
            minutes = None if max_time in ("UNLIMITED", "INFINITE", "NONE") else float(time_min("MaxTime", max_time))
        except UsageError:
            minutes = None
        out.append(Partition(name, fields.get("Default") == "YES", minutes))
    return out


def max_job_minutes(partition: str | None, env: Mapping[str, str] | None = None) -> float | None:
    """The longest --time the partition(s) accept (the default partition without one); None: no limit."""
    parts = parse_partitions(_run(["scontrol", "--all", "show", "partition"], env, 30.0))  # hidden ones too
    wanted = [p for p in parts if (p.name in partition.split(",") if partition else p.default)]
    limits = [p.max_minutes for p in wanted if p.max_minutes is not None]
    return min(limits) if limits else None


def squeue_argv(job_name: str) -> list[str]:
    return ["squeue", "--noheader", "--array", f"--name={job_name}", f"--format={SQUEUE_FORMAT}"]


def parse_squeue(text: str) -> dict[str, QueuedJob]:
    jobs = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 4:
            raise SchedulerUnavailable(f"squeue printed an unexpected line {line[:80]!r}; check that squeue matches SLURM 22.05+")
        jobs[parts[0]] = QueuedJob(*parts)
    return jobs


def queued_jobs(job_name: str, env: Mapping[str, str] | None = None) -> dict[str, QueuedJob]:
    """Jobs of this search that the controller still holds (pending, running, requeued)."""
    return parse_squeue(_run(squeue_argv(job_name), env, 30.0))


def release_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scontrol", "release", ",".join(job_ids)]


def release(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(release_argv(ids), env, 30.0)


def cancel_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scancel", *job_ids]


def cancel(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(cancel_argv(ids), env, 30.0)


def _run(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ if env is None else env), timeout=timeout)
    except FileNotFoundError:
        raise SchedulerUnavailable(f"{argv[0]} is not installed; install slurm-client or use hydra/launcher=submitit_local") from None
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(f"{argv[0]} did not answer within {timeout:.0f}s; slurmctld may be down: check `scontrol ping`") from None
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).strip().splitlines()
        raise SchedulerUnavailable(
            f"{' '.join(argv[:2])} failed: {first[0] if first else 'exit ' + str(proc.returncode)}; check `scontrol ping` and SLURM_CONF"
        )
    return proc.stdout
