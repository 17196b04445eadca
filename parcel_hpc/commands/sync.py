"""``parcel-hpc sync SEARCH_DIR``: record how trials whose jobs vanished ended, for a search whose
launcher has gone (``lifecycle.resolution`` decides; this records)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.ledger import SearchDir
from parcel_hpc.lifecycle import resolution

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)


def run(args: argparse.Namespace) -> int:
    found = resolution.sync(SearchDir(args.search_dir))
    for res in found:
        assert res.ending.cause is not None  # ending_from_accounting always names a cause
        print(f"{res.trial_id}: attempt {res.attempt} {res.ending.how.value} ({res.ending.cause.value})")
    print(f"recorded {len(found)} resolutions")
    return 0
