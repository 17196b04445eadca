"""``parcel-hpc schedule-reconcile``: queue the scheduled accounting reconcile of one search (for admins).

Owns: turning a search directory and an admin's Slurm options into validated ``SbatchValues`` for
``sbatch_templates/reconcile.sbatch``, where the rendered script and the job's output files go, writing
that script and submitting it once.
Must not: reconcile anything itself (the job runs ``python -m parcel_hpc reconcile SEARCH_DIR --json``),
write into the search directory (it only reads ``contract.json``), or queue later runs (the script's
own chain does that, or cron with ``--every-min 0``). Nothing is written or submitted before every
value has been validated and the script rendered.

A second schedule of the same search is harmless: the script queues a successor only when none of
its job name is pending, so the running chain stays one chain.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.governance.contract import load_contract
from parcel_hpc.identity import SearchIdentity, scheduler_name
from parcel_hpc.ledger import SearchDir
from parcel_hpc.scheduler.base import ReconcileSchedule
from parcel_hpc.scheduler.slurm import sbatch

TEMPLATE = "reconcile"


@dataclass(frozen=True)
class Prepared:
    """A rendered reconcile script and where it goes; nothing is on disk or queued yet."""

    values: sbatch.SbatchValues
    script_path: Path
    script: str


def job_name(search_revision: str, identity: SearchIdentity | None) -> str:
    # Not the search's trial job name: reconcile lists that name's jobs, and its own runs must not
    # show up there as orphans. The search id keeps two searches of one revision from sharing (and
    # `scancel --name` from ending) each other's schedule.
    return scheduler_name(f"parcel-reconcile-{search_revision}", identity)


def prepare(request: ReconcileSchedule) -> Prepared:
    """Read the frozen contract, validate every value and render the script (raises UsageError)."""
    # abspath, not resolve(): the job should see the paths the admin named, symlinks included.
    search = Path(os.path.abspath(request.search_dir))
    out = Path(os.path.abspath(request.output_dir))
    contract = load_contract(search)
    identity = SearchDir(search).identity()  # read only: an admin may schedule a search it cannot write
    name = job_name(contract["search_revision"], identity)
    values = sbatch.SbatchValues(
        job_name=name,
        partition=request.partition,
        account=request.account,
        qos=request.qos,
        time_limit_min=request.time_limit_min,
        mem=request.mem,
        output=str(out / f"{name}-%j.json"),
        error=str(out / f"{name}-%j.err"),
        python=sys.executable,
        search_dir=str(search),
        search_revision=contract["search_revision"],
        contract_digest=contract.digest,
        search_id=identity.search_id if identity is not None else "none",
        reconcile_every_min=request.every_min,
    )
    return Prepared(values, out / f"{name}.sbatch", sbatch.render(TEMPLATE, values))


def submit(prepared: Prepared) -> str:
    """Write the script (atomically, 0o644) and submit it; returns the job id."""
    fsio.ensure_dir(prepared.script_path.parent)
    path = sbatch.write_script(prepared.script_path, prepared.script)
    return sbatch.submit(path)


def run(request: ReconcileSchedule, dry_run: bool) -> None:
    """The command: print the script (dry run), or write and submit it and print the job id."""
    prepared = prepare(request)
    if dry_run:
        print(prepared.script, end="")
        return
    job_id = submit(prepared)
    print(job_id)
    v = prepared.values
    print(
        f"wrote {prepared.script_path}; each run writes {v.output} (errors: {v.error}); stop the schedule with `scancel --name={v.job_name}`", file=sys.stderr
    )
