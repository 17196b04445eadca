"""``parcel-hpc cancel SEARCH_DIR [--trial ID ...]``: stop a search, or some of its trials, for good
(``lifecycle.cancel``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.errors import EXIT_PENDING, UsageError
from parcel_hpc.ledger import SearchDir
from parcel_hpc.lifecycle import cancel
from parcel_hpc.ownership import require_own_search

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--trial", action="append", default=[], metavar="TRIAL_ID", help="cancel only this trial (repeat); default: the whole search")
    parser.add_argument("--reason", default="", metavar="TEXT", help="why, in one line (recorded with your user name)")
    parser.add_argument(
        "--wait", type=float, default=60.0, metavar="SECONDS", help="how long to wait for the jobs to end and sacct to file their runs (default %(default)s)"
    )


def run(args: argparse.Namespace) -> int:
    if not args.wait >= 0:  # NaN too
        raise UsageError(f"--wait {args.wait:g} is not a number of seconds >= 0; give seconds to wait for the jobs to end")
    require_own_search(args.search_dir, launch=False)
    report = cancel.run(SearchDir(args.search_dir), args.trial, args.reason, make_console(), wait_s=args.wait)
    if report.still_alive:
        print(f"pending: {len(report.still_alive)} jobs are still ending; rerun the same cancel to settle their budget", file=sys.stderr)
        return EXIT_PENDING
    return 0
