"""``parcel-hpc selection-job SEARCH_DIR {rerun,final} --selection N [--owned UID INODE ID]``: the model
work of a selection, run by ``select`` and ``evaluate-final`` as a scheduler job, never on a login
node (``selection.jobs``). It holds the search directory first (``anchor``): to the identity
``--owned`` gives (what the submitting command found), else to the directory as it finds it now
(its own, and nobody else's to write); another is refused in one line before anything is read."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from parcel_hpc import anchor
from parcel_hpc.ledger import JobRole
from parcel_hpc.ownership import require_own_search
from parcel_hpc.selection import jobs

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("role", choices=[r.value for r in JobRole])
    parser.add_argument("--selection", type=int, required=True, metavar="N")
    parser.add_argument("--owned", nargs=3, metavar=("UID", "INODE", "ID"), help="the search directory as the submitting command found it")


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    if args.owned:
        anchor.hold(anchor.Owned.from_argv([os.path.abspath(args.search_dir), *("-" if w == "none" else w for w in args.owned)]))
    else:
        anchor.enter(args.search_dir)
    result = jobs.run(args.search_dir, JobRole(args.role), args.selection)
    if result is not None:  # None: a gang's other rank, which leaves the job's last words to rank 0
        print(f"{args.role} result {result['digest']}")
    return 0
