"""``parcel-hpc proposals SEARCH_DIR [--replay]``: how each trial was proposed, and whether every
proposal re-derives exactly from its record (``propose.audit``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.console import make_console
from parcel_hpc.ledger import SearchDir
from parcel_hpc.propose import audit

READ_ONLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--replay", action="store_true", help="re-derive each proposal from what it was drawn from; exit 1 at the first that differs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    return audit.show(SearchDir(args.search_dir), replay=args.replay, as_json=args.json, console=make_console())
