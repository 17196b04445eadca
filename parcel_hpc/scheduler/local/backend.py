"""The local backend as the toolkit sees it (``base.Backend``): trials as child processes of a
launch on this host, judged only from this host, and recorded by the ledger alone.

Owns every answer that depends on a job being the local executor's. Must not: signal anything to
learn whether it lives (``probe`` asks with signal 0).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.gpus import visible_devices
from parcel_hpc.ledger import Attempt, JobRole, SearchDir, Started, TrialRecord
from parcel_hpc.probe import Liveness, local_process, seen_from_here
from parcel_hpc.scheduler.base import Backend, Dispatcher, LauncherSettings, QueuedJob, QueueState, SelectionJob, Submit
from parcel_hpc.scheduler.local import EXECUTOR
from parcel_hpc.scheduler.local.launcher import SubmititLocalConf
from parcel_hpc.scheduler.local.runs import local_runs
from parcel_hpc.scheduler.runs import JobRun


def gang_task(job: str, rank: int, ranks: int) -> dict[str, str]:
    """Where task ``rank`` of a job of ``ranks`` tasks on this machine is, in the names submitit's local
    executor gives a trial's tasks (``worker/jobenv.gang_of_job`` reads them); nothing for one task."""
    if ranks <= 1:
        return {}
    names = ("JOB_ID", "NTASKS", "JOB_NUM_NODES", "NODEID", "GLOBALID", "LOCALID")
    return {"SUBMITIT_EXECUTOR": str(EXECUTOR)} | {f"SUBMITIT_LOCAL_{n}": str(v) for n, v in zip(names, (job, ranks, 1, 0, rank, rank), strict=True)}


def wait_as_one(procs: Sequence[subprocess.Popen[bytes]], poll_s: float, after_first_s: float = 60.0) -> None:
    """Wait for a job's tasks as srun's ``--kill-on-bad-exit`` does: a task that exits with an error
    ends the others (this command's own children, by their pids); once the first (rank 0, whose work
    the job is) has ended, the others get ``after_first_s`` to end on their own."""
    first_ended: float | None = None
    while None in (codes := [p.poll() for p in procs]):
        failed = any(code not in (None, 0) for code in codes)
        if procs[0].returncode is not None and first_ended is None:
            first_ended = time.monotonic()
        if failed or (first_ended is not None and time.monotonic() - first_ended > after_first_s):
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(min(poll_s, 0.2))
    for p in procs:
        p.wait()


class LocalBackend(Backend):
    executor = EXECUTOR
    files_runs = False  # no scheduler keeps a record: the ledger's own is final
    accounting = "local executor"
    queues_jobs = False  # a child process of the command that runs it
    launcher = SubmititLocalConf
    launcher_name = "submitit_local"  # hydra-submitit-launcher's names, so its users feel at home

    def dispatcher(self, settings: LauncherSettings, search: SearchDir, max_num_timeout: int, env: Mapping[str, str]) -> Dispatcher:
        # Imported here: submitit (about 0.1 s) is for a launch; read commands reach this module too.
        from parcel_hpc.scheduler.local.dispatcher import LocalDispatcher

        return LocalDispatcher(settings, search, max_num_timeout=max_num_timeout)

    def gang_refusal(self, shape: TrialShape) -> str:
        if shape.nodes > 1:
            return "the local executor runs a trial on this one machine (its ranks: resources.tasks_per_node)"
        return ""

    def job_logs(self, search: SearchDir, job_id: str) -> tuple[Path, Path]:
        from parcel_hpc.scheduler.local.dispatcher import job_logs  # submitit's names: as in ``dispatcher``

        return job_logs(search, job_id)

    def held(self, search: SearchDir, records: Sequence[TrialRecord]) -> dict[str, QueuedJob]:
        # A local job is judged only from its own host (``probe.local_process``): another host's
        # is held, for all this host can tell. A job never started is a child of a launch here.
        out = {}
        for r in records:
            if not r.jobs:
                continue
            job, last = r.jobs[-1], (r.attempts[-1] if r.attempts else None)
            seen = [local_process(job)] if last is None else [local_process(job, last.host), local_process(last.pid, last.host)]
            if any(s is not Liveness.GONE for s in seen):
                out[job] = QueuedJob(job, QueueState.RUNNING, "", last.host if last is not None else "")
        return out

    def run_selection_job(self, job: SelectionJob, submitted: Submit, poll_s: float) -> str:
        # -P: the working directory (a checkout beside the search) never shadows the installed parcel_hpc.
        owned = job.owned.argv()
        argv = [sys.executable, "-P", "-m", "parcel_hpc", "selection-job", *owned[:1], job.role.value, "--selection", str(job.selection), "--owned", *owned[1:]]
        pending = job.log_dir / f"{job.role.value}-starting-{os.getpid()}.out"
        ranks = job.shape.ranks  # this one machine's (the local executor runs no gang over nodes)
        with open(pending, "ab") as out:
            procs = [
                subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=os.environ | gang_task(str(os.getpid()), rank, ranks)
                )
                for rank in range(ranks)
            ]
        job_id = str(procs[0].pid)  # rank 0's: the job's work and its result are rank 0's
        os.replace(pending, job.log(job_id))  # named by its job id, like a SLURM job's output (the open file follows)
        submitted(job_id, socket.gethostname())
        wait_as_one(procs, poll_s)
        return job_id

    def selection_job_liveness(self, job_id: str, host: str, search: SearchDir, role: JobRole) -> Liveness:
        return local_process(job_id, host)

    def judged_here(self, attempt: Attempt) -> bool:
        return seen_from_here(attempt.host)

    def started(self, env: Mapping[str, str], host: str, pid: int, process_started: float | None) -> Started:
        job = env.get("SUBMITIT_LOCAL_JOB_ID", "")
        devices = env.get("CUDA_VISIBLE_DEVICES", "")
        granted = len(visible_devices(devices))  # the executor set it: what it handed out
        return Started(self.executor, job, job, host, host, pid, 0, devices, granted, process_started)

    def local_runs(self, records: Sequence[TrialRecord], user: str) -> list[JobRun]:
        return local_runs(records, user)
