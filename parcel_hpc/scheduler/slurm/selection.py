"""A selection job on SLURM: its batch script (``templates/winner_rerun.sbatch``, ``final_eval.sbatch``)
rendered from the launch's resources, submitted, and followed with squeue until it leaves the queue.

Owns the script's values and the wait. Must not: decide what the job does (``selection/jobs.py``)
or read its result (``selection/submit.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from parcel_hpc.errors import UsageError
from parcel_hpc.identity import scheduler_name
from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.scheduler.base import LauncherSettings, SelectionJob, Submit
from parcel_hpc.scheduler.slurm import queue, sbatch

TEMPLATES = {JobRole.RERUN: "winner_rerun", JobRole.FINAL: "final_eval"}


def job_name(search: SearchDir, settings: LauncherSettings, role: JobRole) -> str:
    """``<job_name>-rerun-<search id>``: never a trial job's name, never another search's."""
    return scheduler_name(f"{settings.params['job_name']}-{role.value}", search.identity())


def job_name_of(search: SearchDir, role: JobRole) -> str:
    """The name of the search's selection job of ``role``, on the launcher its latest launch used."""
    recorded = search.last_launcher()
    if recorded is None:
        raise UsageError(f"{search.path} records no launch that dispatched trials; there is nothing to select from")
    return job_name(search, LauncherSettings.from_json(recorded), role)


def render_script(job: SelectionJob, python: str = sys.executable) -> tuple[Path, str]:
    """The batch script for this job and where it goes (nothing written yet)."""
    from parcel_hpc.scheduler.slurm.dispatcher import shape_parameters  # imports submitit: not when Hydra scans plugins

    contract = job.search.contract()
    res = job.settings.resources
    values = sbatch.SbatchValues(
        job_name=job_name(job.search, job.settings, job.role),
        partition=str(res.get("partition") or ""),
        account=str(res.get("account") or ""),
        qos=str(res.get("qos") or ""),
        time_limit_min=job.time_limit_min,
        mem=f"{max(1, int(float(res['mem_gb']) * 1024))}M",
        cpus_per_task=job.shape.cpus_per_rank,
        nodes=job.shape.nodes,
        tasks_per_node=job.shape.tasks_per_node,
        gres=str(shape_parameters(job.shape).get("gres", "")),  # per node, as a trial's job of this shape asks
        output=str(job.log("%j")),
        python=python,
        search_dir=str(job.search.path),
        search_revision=contract["search_revision"],
        contract_digest=contract.digest,
        search_id=job.owned.search_id or "none",
        selection=job.selection,
        search_uid=job.owned.uid,
        search_inode=job.owned.inode,
    )
    return job.log_dir / f"{TEMPLATES[job.role]}.sbatch", sbatch.render(TEMPLATES[job.role], values)


def run(job: SelectionJob, submitted: Submit, poll_s: float) -> str:
    path, script = render_script(job)
    sbatch.write_script(path, script)
    job_id = sbatch.submit(path)
    submitted(job_id, "")
    name = job_name(job.search, job.settings, job.role)
    while job_id in queue.queued_jobs(name):  # alive while squeue lists it
        time.sleep(poll_s)
    return job_id
