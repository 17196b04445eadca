"""SLURM accounting: build the sacct argv, run it, parse its text into columns, group job runs.

    sacct.py     SACCT_FIELDS, build_sacct_argv (pure), run_sacct (the only subprocess)
    states.py    JobState: every sacct state word, mapped once, with predicates
    parse.py     parse_sacct -> SacctTable (columnar, pyarrow; no object per line)
    _malformed   the error path: which line is bad and why (one place for those messages)
    runs.py      JobRun, run_table / totals_by_job (columnar), job_runs -> [JobRun]

Reconciling against the ledger and the budget is built on top of this package, not in it.
"""

from parcel_hpc.accounting.parse import SCHEMA, SacctTable, parse_sacct
from parcel_hpc.accounting.runs import RUN_COLUMNS, JobRun, job_runs, run_table, runs_by_job, totals_by_job
from parcel_hpc.accounting.sacct import (
    DEFAULT_TIMEOUT_S,
    SACCT_FIELDS,
    SACCT_FORMAT,
    build_sacct_argv,
    run_sacct,
)
from parcel_hpc.accounting.states import JobState

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RUN_COLUMNS",
    "SACCT_FIELDS",
    "SACCT_FORMAT",
    "SCHEMA",
    "JobRun",
    "JobState",
    "SacctTable",
    "build_sacct_argv",
    "job_runs",
    "parse_sacct",
    "run_sacct",
    "run_table",
    "runs_by_job",
    "totals_by_job",
]
