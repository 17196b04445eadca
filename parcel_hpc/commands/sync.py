"""``parcel-hpc sync SEARCH_DIR``: record how trials whose jobs vanished ended, for a search whose
launcher has gone (``lifecycle.resolution`` decides; this records), and settle the budget holds
left on attempts that ended (``lifecycle.settlement``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.ledger import SearchDir
from parcel_hpc.lifecycle import resolution
from parcel_hpc.ownership import require_own_search

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    found, settled = resolution.sync(SearchDir(args.search_dir))
    for res in found:
        assert res.ending.cause is not None  # ending_from_accounting always names a cause
        print(f"{res.trial_id}: attempt {res.attempt} {res.ending.how.value} ({res.ending.cause.value})")
    for hold in settled:
        print(f"{hold.key}: settled the budget hold of an ended attempt ({hold.held_gpu_hours:.4f} GPU-h, {hold.held_cpu_hours:.4f} CPU-h were held)")
    print(f"recorded {len(found)} resolutions; settled {len(settled)} budget holds")
    return 0
