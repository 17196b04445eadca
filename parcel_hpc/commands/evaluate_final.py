"""``parcel-hpc evaluate-final SEARCH_DIR``: evaluate the selected artifact and the baseline once on
the protected final partition (``selection.actions``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.ownership import require_own_search
from parcel_hpc.selection import actions

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    actions.evaluate_final(args.search_dir, console=make_console(stderr=True), out=make_console())
    return 0
