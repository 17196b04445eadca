"""The SLURM backend as the toolkit sees it (``base.Backend``): its queue, its job environment,
what a signal to its job means, and sacct's record of each run.

Owns every answer that depends on a job being SLURM's. Must not: decide anything about trials
(``lifecycle`` does, from what this says).
"""

from __future__ import annotations

import datetime as _dt
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.gpus import visible_devices
from parcel_hpc.ledger import Cause, JobRole, SearchDir, Started, TrialRecord
from parcel_hpc.probe import Liveness
from parcel_hpc.scheduler.base import Backend, Dispatcher, LauncherSettings, QueuedJob, ReconcileSchedule, SelectionJob, Submit
from parcel_hpc.scheduler.runs import JobRun, StepUsage
from parcel_hpc.scheduler.slurm import EXECUTOR, queue, scheduled, selection
from parcel_hpc.scheduler.slurm.launcher import SubmititSlurmConf, check
from parcel_hpc.scheduler.slurm.sacct import SACCT_FORMAT, run_sacct
from parcel_hpc.scheduler.slurm.steps import build_steps_argv, parse_steps

if TYPE_CHECKING:
    import pyarrow as pa

# How an admin exports the dump ``reconcile --sacct-file`` reads.
DUMP_HINT = f"sacct --parsable2 --noheader --duplicates --format={SACCT_FORMAT}"


class SlurmBackend(Backend):
    executor = EXECUTOR
    files_runs = True  # slurmdbd files each run (sacct): an attempt's hours are provisional until recorded
    accounting = "sacct"
    queues_jobs = True
    launcher = SubmititSlurmConf
    launcher_name = "submitit_slurm"  # hydra-submitit-launcher's names, so its users feel at home

    def dispatcher(self, settings: LauncherSettings, search: SearchDir, max_num_timeout: int, env: Mapping[str, str]) -> Dispatcher:
        # Imported here: submitit (about 0.1 s) is for a launch; read commands reach this module too.
        from parcel_hpc.scheduler.slurm.dispatcher import SlurmDispatcher

        return SlurmDispatcher(settings, search, max_num_timeout=max_num_timeout, env=env)

    def job_logs(self, search: SearchDir, job_id: str) -> tuple[Path, Path]:
        from parcel_hpc.scheduler.slurm.dispatcher import job_logs  # submitit's names: as in ``dispatcher``

        return job_logs(search, job_id)

    def gang_refusal(self, shape: TrialShape) -> str:
        return ""  # srun starts the job's tasks on its nodes: every shape runs

    def node_names(self, node_list: str) -> list[str]:
        return queue.node_names(node_list)

    def node_address(self, node: str) -> str:
        try:
            socket.getaddrinfo(node, None)
            return node  # a host name the other nodes resolve
        except OSError:
            return queue.node_address(node)

    def held(self, search: SearchDir, records: Sequence[TrialRecord]) -> dict[str, QueuedJob]:
        return queue.search_jobs(search)

    def started(self, env: Mapping[str, str], host: str, pid: int, process_started: float | None) -> Started | None:
        if not env.get("SLURM_JOB_ID"):
            return None
        array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        job_id = f"{array_job}_{task}" if array_job and task else env["SLURM_JOB_ID"]
        return Started(
            self.executor,
            job_id,
            env["SLURM_JOB_ID"],
            env.get("SLURMD_NODENAME", host),
            host,
            pid,
            int(env.get("SLURM_RESTART_COUNT", "0") or 0),
            env.get("CUDA_VISIBLE_DEVICES", ""),
            _gpus(env),
            process_started,
        )

    def run_selection_job(self, job: SelectionJob, submitted: Submit, poll_s: float) -> str:
        return selection.run(job, submitted, poll_s)

    def selection_job_liveness(self, job_id: str, host: str, search: SearchDir, role: JobRole) -> Liveness:
        return Liveness.ALIVE if job_id in queue.queued_jobs(selection.job_name_of(search, role)) else Liveness.GONE

    def signal_cause(self, facts: Started) -> Cause:
        # A preemption sets PreemptTime on the job (observed on 22.05); a time-limit warning leaves it None.
        try:
            out = subprocess.run(["scontrol", "show", "job", facts.raw_job_id], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return Cause.TIMEOUT
        for token in out.split():
            if token.startswith("PreemptTime="):
                return Cause.TIMEOUT if token.split("=", 1)[1] in ("None", "") else Cause.PREEMPTED
        return Cause.TIMEOUT

    # sacct's runs: ``accounting`` (pyarrow's tables), loaded at the first read, so that a trial's
    # worker and a launch, which read none, never load pyarrow.
    def runs(self, job_ids: Sequence[str]) -> dict[str, list[JobRun]]:
        from parcel_hpc.scheduler.slurm import accounting

        return accounting.runs(job_ids)

    def steps(self, job_ids: Sequence[str]) -> list[StepUsage]:
        return parse_steps(run_sacct(build_steps_argv(job_ids)).decode("utf-8", "replace"))

    def listed(self, search: SearchDir) -> pa.Table:
        from parcel_hpc.scheduler.slurm import accounting

        return accounting.listed(search)

    def account_runs(self, account: str, since: _dt.datetime) -> pa.Table:
        from parcel_hpc.scheduler.slurm import accounting

        return accounting.account_runs(account, since)

    def check_launcher(self, launcher: Mapping[str, Any]) -> None:
        check(launcher)

    def schedule_reconcile(self, request: ReconcileSchedule, dry_run: bool) -> None:
        scheduled.run(request, dry_run)

    def known_accounts(self) -> list[str]:
        return queue.known_accounts()

    def dump_runs(self, path: Path) -> pa.Table:
        from parcel_hpc.scheduler.slurm import accounting

        try:
            return accounting.dump_runs(path)
        except OSError as exc:
            raise UsageError(f"cannot read --sacct-file {path}: {exc.strerror or exc}; export it with `{DUMP_HINT}`") from None


def _gpus(env: Mapping[str, str]) -> int | None:
    """GPUs SLURM allocated to the job on this node (None where it does not say: the request stands)."""
    if env.get("SLURM_GPUS_ON_NODE", "").strip().isdigit():
        return int(env["SLURM_GPUS_ON_NODE"])
    if env.get("SLURM_JOB_GPUS", "").strip():
        return len(visible_devices(env["SLURM_JOB_GPUS"]))
    return None
