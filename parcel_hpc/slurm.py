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

from .errors import SchedulerUnavailable

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
    return parse_squeue(_run(squeue_argv(job_name), dict(os.environ if env is None else env), 30.0))


def release_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scontrol", "release", ",".join(job_ids)]


def release(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(release_argv(ids), dict(os.environ if env is None else env), 30.0)


def cancel_argv(job_ids: Iterable[str]) -> list[str]:
    return ["scancel", *job_ids]


def cancel(job_ids: Iterable[str], env: Mapping[str, str] | None = None) -> None:
    ids = list(job_ids)
    if ids:
        _run(cancel_argv(ids), dict(os.environ if env is None else env), 30.0)


def _run(argv: list[str], env: dict, timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
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
