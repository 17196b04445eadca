"""Small helpers for tests that drive the dev SLURM cluster."""

import functools
import os
import signal
import subprocess
from pathlib import Path

from parcel_hpc.testing import runs

wait_for = functools.partial(runs.wait_for, every=1.0)  # the cluster's own pace: squeue once a second


def sh(*argv: str, check: bool = True, timeout: float = 60) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


REPO = Path(__file__).resolve().parents[2]
PREEMPTOR = "preemptor"  # the job name preempt() submits: a cluster_guard's names list it to clean it up


def preempt(nodes: str, claim: str = "--gres=gpu:4") -> None:
    """A high-priority job on ``nodes`` (one, or ``n1,n3``) claiming ``claim`` on each (all of its GPUs;
    ``--exclusive``: all of it) preempts every trial running there."""
    count = str(len(nodes.split(",")))
    sh("sbatch", "-p", "high", "-w", nodes, "-N", count, claim, "--mem=100M", "-t", "2", "-J", PREEMPTOR, "-o", "/dev/null", "--wrap", "sleep 3")


def cluster_base() -> Path:
    """The dev cluster's directory (scripts/dev-cluster-up.sh BASE writes BASE/etc/slurm.conf)."""
    return Path(os.environ["SLURM_CONF"]).parent.parent


def kill_daemon(name: str, sig: int = signal.SIGKILL) -> None:
    """Kill this dev cluster's daemon ``name`` (``slurmctld``, ``slurmdbd``, ``slurmd-n2``: the pid file
    scripts/dev-cluster-up.sh wrote under BASE/run/pids/) and wait until it has exited. Found by its
    pid file and checked to be that daemon of this BASE, never by name: another cluster's daemons of
    the same name run on the same machine."""
    pid = runs.own_daemon_pid(cluster_base(), name)
    assert pid is not None, f"the dev cluster at {cluster_base()} runs no {name}"
    os.kill(pid, sig)
    wait_for(lambda: runs.own_daemon_pid(cluster_base(), name) is None, 30, f"{name} (pid {pid}) to exit")


def daemons(base: Path) -> dict[str, int]:
    """The live daemons of the dev cluster in ``base``, by the name of their pid file, checked as
    ``kill_daemon`` checks them."""
    names = sorted(p.stem for p in (base / "run" / "pids").glob("*.pid"))
    return {name: pid for name in names if (pid := runs.own_daemon_pid(base, name)) is not None}


def restart_daemons() -> None:
    """Start whatever daemon of the dev cluster is not running (the script's own idempotent start)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "dev-cluster-up.sh"), str(cluster_base())], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]


def what_the_cluster_says(name: str) -> str:
    """The queue, the accounting and the nodes for jobs named ``name*``: appended to a timeout's
    message, so a run that failed elsewhere (CI) says where the jobs stood."""
    queue = [l for l in sh("squeue", "-h", "-a", "-o", "%i|%j|%T|%r|%N|%S", check=False).splitlines() if f"|{name}" in l]
    acct = sh("sacct", "-n", "-P", "-X", "-D", f"--name={name}", "-S", "now-1hour", "-o", "JobID,State,Reason,NodeList,Restarts,Start,End", check=False)
    nodes = sh("sinfo", "-N", "-h", "-o", "%N|%T|%E", check=False)
    return f"squeue: {queue}\nsacct (duplicates too):\n{acct}\nnodes:\n{nodes}"
