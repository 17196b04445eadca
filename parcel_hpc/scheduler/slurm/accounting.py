"""sacct's record of runs as the SLURM backend's accounting reads return it: ``JobRun`` records by
job id, and ``run_table`` tables of a search's job names, of an account, of an exported dump.

Apart from ``backend`` (which loads it at the first such read) because its tables are pyarrow's: a
trial's worker, a launch and the commands that read no accounting never load pyarrow.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from parcel_hpc.ledger import SearchDir
from parcel_hpc.scheduler.run_table import runs_table
from parcel_hpc.scheduler.runs import JobRun, runs_by_job
from parcel_hpc.scheduler.slurm import EXECUTOR
from parcel_hpc.scheduler.slurm.runs import run_table, sacct_runs
from parcel_hpc.scheduler.slurm.sacct import build_sacct_argv, installed_version, run_sacct
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct, parse_sacct_file


def runs(job_ids: Sequence[str]) -> dict[str, list[JobRun]]:
    return runs_by_job(sacct_runs(parse_sacct(run_sacct(build_sacct_argv(job_ids, version=installed_version())), source="sacct", allocations_only=True)))


def listed(search: SearchDir) -> pa.Table:
    # From a minute before the contract was frozen (the search's first job is after it), every
    # user's: an admin reconciling a colleague's search sees the orphans of every user.
    since = int((search.path / "contract.json").stat().st_mtime) - 60
    named = (
        run_table(
            parse_sacct(
                run_sacct(build_sacct_argv([], since=since, name=name, all_users=True, version=installed_version())),
                source="sacct --name",
                allocations_only=True,
            )
        )
        for name in search.job_names(EXECUTOR)
    )
    return pa.concat_tables([runs_table([]), *named])


def account_runs(account: str, since: _dt.datetime) -> pa.Table:
    argv = build_sacct_argv([], since=since, account=account, all_users=True, truncate=True, version=installed_version())
    return run_table(parse_sacct(run_sacct(argv), source=f"sacct --accounts={account}", allocations_only=True))


def dump_runs(path: Path) -> pa.Table:
    """OSError when the file cannot be read (the backend says how to export one)."""
    return run_table(parse_sacct_file(path, source=str(path), allocations_only=True))
