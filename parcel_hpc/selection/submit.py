"""Run a selection job on the launcher the search's trials ran on, and wait for it.

Local (the embedded default): a child process running ``python -P -m parcel_hpc selection-job``.
SLURM: ``scheduler/slurm/templates/winner_rerun.sbatch`` or ``final_eval.sbatch``, rendered here from the
search's launch record (partition, account, QOS, GPUs, memory, time), written beside the job's
logs and submitted; the job is followed with squeue until it leaves the queue. Its result file,
written last by the job, is what says it succeeded. Either way the job is told the search
directory's identity as this command found it (``--owned UID INODE ID``), and holds the directory
to it before it reads, imports or writes anything (``anchor``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from parcel_hpc import anchor, fsio
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.identity import scheduler_name
from parcel_hpc.ledger import Executor, JobRole
from parcel_hpc.ledger.selection import JobSubmitted, SelectionWriter
from parcel_hpc.probe import local_process
from parcel_hpc.scheduler.base import LauncherSettings
from parcel_hpc.scheduler.slurm import queue as slurm
from parcel_hpc.scheduler.slurm import sbatch
from parcel_hpc.selection.store import SelectionStore

TEMPLATES = {JobRole.RERUN: "winner_rerun", JobRole.FINAL: "final_eval"}


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    ok: bool
    message: str


def launcher_of(store: SelectionStore) -> LauncherSettings:
    """The launcher of the search's latest launch that dispatched anything."""
    recorded = store.search.last_launcher()
    if recorded is not None:
        return LauncherSettings.from_json(recorded)
    raise UsageError(f"{store.search.path} records no launch that dispatched trials; there is nothing to select from")


def job_name(store: SelectionStore, settings: LauncherSettings, role: JobRole) -> str:
    """``<job_name>-rerun-<search id>``: never a trial job's name, never another search's."""
    return scheduler_name(f"{settings.params['job_name']}-{role.value}", store.search.identity())


def job_time_limit_min(trial_limit_min: int, role: JobRole) -> int:
    """The rerun trains two full models (the rerun and the baseline) and measures serving: twice a
    trial's limit and ten minutes more; the final job only scores, within one trial's limit."""
    return 2 * trial_limit_min + 10 if role is JobRole.RERUN else trial_limit_min


def render_script(
    store: SelectionStore, settings: LauncherSettings, role: JobRole, n: int, owned: anchor.Owned, python: str = sys.executable
) -> tuple[Path, str]:
    """The batch script for this job and where it goes (nothing written yet); ``owned``: the search
    directory as the command found it, which the job holds before anything else."""
    contract = store.search.contract()
    res = settings.resources
    logs = store.log_dir(n)
    values = sbatch.SbatchValues(
        job_name=job_name(store, settings, role),
        partition=str(res.get("partition") or ""),
        account=str(res.get("account") or ""),
        qos=str(res.get("qos") or ""),
        time_limit_min=job_time_limit_min(int(res["time_limit_min"]), role),
        mem=f"{max(1, int(float(res['mem_gb']) * 1024))}M",
        cpus_per_task=int(res["cpus"]),
        gres=f"gpu:{int(res['gpus'])}" if int(res.get("gpus") or 0) > 0 else "",
        output=str(logs / f"{role.value}-%j.out"),
        python=python,
        search_dir=str(store.search.path),
        search_revision=contract["search_revision"],
        contract_digest=contract.digest,
        search_id=owned.search_id or "none",
        selection=n,
        search_uid=owned.uid,
        search_inode=owned.inode,
    )
    return logs / f"{TEMPLATES[role]}.sbatch", sbatch.render(TEMPLATES[role], values)


def job_alive(store: SelectionStore, submitted: JobSubmitted) -> bool | None:
    """Whether a submitted selection job still runs; None when this host cannot tell (a local job
    started on another host)."""
    if submitted.executor is Executor.SLURM:
        return submitted.job_id in slurm.queued_jobs(job_name(store, launcher_of(store), submitted.role))
    return local_process(submitted.job_id, submitted.host).as_bool()


def run_job(store: SelectionStore, role: JobRole, n: int, writer: SelectionWriter, console: Console, poll_s: float = 1.0) -> JobOutcome:
    """Run the job and wait for it; when one for the same selection and role is still running
    (another ``select`` started it, or this one was interrupted), wait for that one instead."""
    settings = launcher_of(store)
    owned = anchor.identify(store.search.path)  # the directory as this command found it: the job holds it to this
    fsio.ensure_dir(store.log_dir(n))
    last = store.record().last_job(n, role)
    if isinstance(last, JobSubmitted) and job_alive(store, last):
        job_id = last.job_id
        console.print(f"{role.value} job {job_id} is already running: waiting for it")
        while job_alive(store, last):
            time.sleep(poll_s)
        log = store.log_dir(n) / f"{role.value}-{job_id}.out"
    elif settings.kind is Executor.SLURM:
        path, script = render_script(store, settings, role, n, owned)
        sbatch.write_script(path, script)
        job_id = sbatch.submit(path)
        writer.job_submitted(n, role, job_id, Executor.SLURM)
        console.print(f"{role.value} job {job_id} submitted to SLURM ({path.name}); waiting for it to leave the queue")
        name = job_name(store, settings, role)
        while job_id in slurm.queued_jobs(name):
            time.sleep(poll_s)
        log = store.log_dir(n) / f"{role.value}-{job_id}.out"
    else:
        # -P: the working directory (a checkout beside the search) never shadows the installed parcel_hpc.
        argv = [sys.executable, "-P", "-m", "parcel_hpc", "selection-job", *owned.argv()[:1], role.value, "--selection", str(n), "--owned", *owned.argv()[1:]]
        pending = store.log_dir(n) / f"{role.value}-starting-{os.getpid()}.out"
        with open(pending, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(os.environ))
        job_id = str(proc.pid)
        log = store.log_dir(n) / f"{role.value}-{job_id}.out"
        os.replace(pending, log)  # named by its job id, like a SLURM job's output (the open file follows)
        writer.job_submitted(n, role, job_id, Executor.LOCAL, socket.gethostname())
        console.print(f"{role.value} job {job_id} started on this machine")
        proc.wait()
    result = store.result(n, role)
    if result is None:
        tail = _last_line(store, log)
        message = f"the {role.value} job {job_id} ended without a result: {tail[0] if tail else 'no output'} (log {log})"
        writer.job_ended(n, role, job_id, False, message=message)
        return JobOutcome(job_id, False, message)
    writer.job_ended(n, role, job_id, True, result["digest"])
    return JobOutcome(job_id, True, "")


def _last_line(store: SelectionStore, log: Path) -> list[str]:
    """The last line of a selection job's output file, read as a record is (within the search,
    only its end); none when it is not there to read."""
    try:
        with fsio.Folder.open(log.parent, within=store.search.path) as folder:
            data, _ = folder.read_tail(log.name, 2**16)
    except (FileNotFoundError, CorruptRecord):
        return []
    return data.decode(errors="replace").strip().splitlines()[-1:]
