"""``parcel-hpc selection-job SEARCH_DIR {rerun,final} --selection N``: the model work of a selection,
run by ``select`` and ``evaluate-final`` as a scheduler job, never on a login node (``selection.jobs``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.ledger import JobRole
from parcel_hpc.ownership import require_own_search
from parcel_hpc.selection import jobs

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("role", choices=[r.value for r in JobRole])
    parser.add_argument("--selection", type=int, required=True, metavar="N")


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    result = jobs.run(args.search_dir, JobRole(args.role), args.selection)
    print(f"{args.role} result {result['digest']}")
    return 0
