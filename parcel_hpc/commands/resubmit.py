"""``parcel-hpc resubmit SEARCH_DIR``: after node drains or failures, rerun exactly the trials whose
jobs ended without a result for infrastructure reasons (``lifecycle.resubmit`` decides,
``launch.resubmit`` dispatches through the launch's Follower)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.launch import resubmit
from parcel_hpc.ledger import SearchDir
from parcel_hpc.ownership import require_own_search

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
    parser.add_argument("--wait", action="store_true", help="follow the resubmitted trials until they end")


def run(args: argparse.Namespace) -> int:
    if not args.dry_run:  # a dry run changes nothing: anyone who can read the search may ask
        require_own_search(args.search_dir, launch=False)
    resubmit.run(SearchDir(args.search_dir), dry_run=args.dry_run, wait=args.wait, console=make_console())
    return 0
