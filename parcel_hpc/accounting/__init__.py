"""SLURM accounting: build the sacct argv, run it, parse its text into columns, group attempts.

    sacct.py     SACCT_FIELDS, build_sacct_argv (pure), run_sacct (the only subprocess)
    states.py    JobState: every sacct state word, mapped once, with predicates
    parse.py     parse_sacct -> SacctTable (columnar, pyarrow; no object per line)
    _malformed   the error path: which line is bad and why (one place for those messages)
    attempt.py   Attempt, attempt_table / totals_by_job (columnar), attempts -> [Attempt]

Reconciling against the ledger and the budget is built on top of this package, not in it.
"""

from parcel_hpc.accounting.attempt import ATTEMPT_COLUMNS, Attempt, attempt_table, attempts, totals_by_job
from parcel_hpc.accounting.parse import SCHEMA, SacctTable, parse_sacct
from parcel_hpc.accounting.sacct import (
    DEFAULT_TIMEOUT_S,
    SACCT_FIELDS,
    SACCT_FORMAT,
    build_sacct_argv,
    run_sacct,
)
from parcel_hpc.accounting.states import JobState

__all__ = [
    "ATTEMPT_COLUMNS",
    "Attempt",
    "DEFAULT_TIMEOUT_S",
    "JobState",
    "SACCT_FIELDS",
    "SACCT_FORMAT",
    "SCHEMA",
    "SacctTable",
    "attempt_table",
    "attempts",
    "build_sacct_argv",
    "parse_sacct",
    "run_sacct",
    "totals_by_job",
]
