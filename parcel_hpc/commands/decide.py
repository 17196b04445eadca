"""``parcel-hpc decide SEARCH_DIR --accept --by NAME --reason TEXT``: a documented decision that
lifts the selected trial's decidable hold, one at a time (``selection.actions.decide``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.ownership import require_own_search
from parcel_hpc.selection import actions

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument(
        "--accept",
        action="store_true",
        required=True,
        help="accept the selected trial despite the hold it is at (performance, slice quality, final performance)",
    )
    parser.add_argument("--by", required=True, metavar="NAME", help="who decides")
    parser.add_argument("--reason", required=True, metavar="TEXT", help="why, in one line (link a document for more)")


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    a = actions.decide(args.search_dir, by=args.by, reason=args.reason, out=make_console())
    return a.verdict.exit_code
