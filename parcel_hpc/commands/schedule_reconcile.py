"""``parcel-hpc schedule-reconcile SEARCH_DIR --output-dir DIR``: submit a Slurm job that runs
``reconcile --json`` on a schedule (for admins; ``accounting.scheduled``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.accounting import scheduled

READ_ONLY = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("--output-dir", type=Path, required=True, metavar="DIR", help="where the script and each run's JSON report and stderr go")
    parser.add_argument(
        "--every-min", type=int, default=60, metavar="N", help="minutes between runs; 0: one run, cron submits the written script (default %(default)s)"
    )
    parser.add_argument("--partition", default="", metavar="P", help="Slurm partition (default: the cluster's default)")
    parser.add_argument("--account", default="", metavar="A", help="Slurm account (default: yours)")
    parser.add_argument("--qos", default="", metavar="Q", help="Slurm QOS (default: the account's)")
    parser.add_argument("--time-limit-min", type=int, default=15, metavar="M", help="time limit of each run in minutes (default %(default)s)")
    parser.add_argument("--mem", default="1G", metavar="MEM", help="memory of each run, like 1G (default %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the rendered script; write and submit nothing")


def run(args: argparse.Namespace) -> int:
    scheduled.run(
        args.search_dir,
        args.output_dir,
        dry_run=args.dry_run,
        every_min=args.every_min,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time_limit_min=args.time_limit_min,
        mem=args.mem,
    )
    return 0
