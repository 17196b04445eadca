"""``parcel-hpc sync SEARCH_DIR``: record how trials whose jobs vanished ended, for a search whose
launcher has gone (``lifecycle.resolution`` decides; this records), the scheduler's record of every
run sacct has filed (the hours every command then prints settled), and settle the budget holds
left on attempts that ended or restate those the scheduler's record changed (``lifecycle.settlement``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.accounting.spend import shown
from parcel_hpc.ledger import SearchDir
from parcel_hpc.lifecycle import resolution
from parcel_hpc.ownership import require_own_search

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)


def run(args: argparse.Namespace) -> int:
    require_own_search(args.search_dir, launch=False)
    done = resolution.sync(SearchDir(args.search_dir))
    for res in done.resolutions:
        assert res.ending.cause is not None  # ending_from_accounting always names a cause
        print(f"{res.trial_id}: attempt {res.attempt} {res.ending.how.value} ({res.ending.cause.value})")
    runs = len({f.run.key for f in done.runs})
    for hold in done.holds:
        if hold.settled:
            print(
                f"{hold.key}: restated the budget charge of an attempt to what the scheduler's record of its run gives it"
                f" ({shown(hold.charged.gpu_hours)} GPU-h, {shown(hold.charged.cpu_hours)} CPU-h were charged; now {shown(hold.used.gpu_hours)}, {shown(hold.used.cpu_hours)})"
            )
        else:
            print(
                f"{hold.key}: settled the budget hold of an ended attempt ({shown(hold.charged.gpu_hours)} GPU-h, {shown(hold.charged.cpu_hours)} CPU-h were held)"
            )
    print(f"recorded {len(done.resolutions)} resolutions and the scheduler's record of {runs} runs; settled {len(done.holds)} budget holds")
    return 0
