"""``parcel-hpc schedule-reconcile SEARCH_DIR --output-dir DIR``: submit a job that runs
``reconcile --json`` on a schedule (for admins): the first backend that queues jobs, SLURM's
``scheduler/slurm/scheduled.py``."""

from __future__ import annotations

import argparse
from pathlib import Path

from parcel_hpc.scheduler.base import ReconcileSchedule
from parcel_hpc.scheduler.registry import BACKENDS, DEFAULT

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
    request = ReconcileSchedule(args.search_dir, args.output_dir, args.every_min, args.partition, args.account, args.qos, args.time_limit_min, args.mem)
    next((b for b in BACKENDS if b.queues_jobs), DEFAULT).schedule_reconcile(request, dry_run=args.dry_run)
    return 0
