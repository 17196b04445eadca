"""``parcel-hpc select SEARCH_DIR``: freeze the completed list, rerun the winner, retrain the
approved baseline and judge every gate validation can decide (``selection.actions``). Prints the disposition first."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.ownership import require_own_search
from parcel_hpc.selection import actions

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--now", action="store_true", help="select before the budget cap (needs --reason; recorded as early)")
    parser.add_argument(
        "--trial", metavar="TRIAL_ID", help="a new selection of this trial instead of the best (needs --reason; before the final evaluation only)"
    )
    parser.add_argument("--reason", default="", metavar="TEXT", help="why select now, or why another trial")


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    a = actions.select(args.search_dir, now=args.now, trial=args.trial, reason=args.reason, console=make_console(stderr=True), out=make_console())
    return a.verdict.exit_code
