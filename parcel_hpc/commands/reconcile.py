"""``parcel-hpc reconcile``: the scheduler's accounting against the ledger and the budget (for admins).

``reconcile SEARCH_DIR ...`` (``accounting.search_report``), or over many searches: ``--root ROOT``
and ``--account NAME --since DATE`` (``accounting.account_report``). The report as a table,
``--json`` or ``--csv``, and ``--html FILE`` beside it; exit 4 while the scheduler has not filed
every job in full.

Must not write under a search: admins reconcile searches they cannot write to.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Console

from parcel_hpc import fsio
from parcel_hpc.accounting import search_report
from parcel_hpc.console import make_console
from parcel_hpc.errors import EXIT_PENDING, UsageError
from parcel_hpc.ledger import SearchDir
from parcel_hpc.scheduler.registry import BACKENDS

READ_ONLY = True
RETRY_S = 5.0  # between passes while --wait lasts and jobs are pending


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dirs", type=Path, nargs="*", metavar="SEARCH_DIR")
    parser.add_argument("--root", type=Path, metavar="ROOT", help="every search under ROOT, totalled by user, search and partition")
    parser.add_argument(
        "--account",
        metavar="NAME",
        help="every job charged to this SLURM account (all users) since --since, matched to the searches under --root; an account sacctmgr does not know is refused",
    )
    parser.add_argument("--since", metavar="DATE", help="with --account: from this date (YYYY-MM-DD or ISO date and time; UTC unless it says)")
    parser.add_argument("--sacct-file", type=Path, help="an exported `sacct --parsable2 --noheader --duplicates` dump instead of calling sacct")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--csv", action="store_true", help="print one CSV row per attempt")
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained HTML report with plots")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"wait up to this long for the scheduler to file every job in full; exit {EXIT_PENDING} if some are still pending",
    )


def run(args: argparse.Namespace) -> int:
    if not args.wait >= 0:  # NaN too
        raise UsageError(f"--wait {args.wait:g} is not a number of seconds >= 0; give seconds to wait, or 0 not to wait")
    if args.html is not None:
        fsio.check_output(args.html, "--html")  # before sacct is asked: a wrong path costs nothing
    if args.root is not None or args.account is not None:
        return _many(args)
    if not args.search_dirs:
        raise UsageError("reconcile needs SEARCH_DIR ..., --root ROOT, or --account NAME --since DATE; see `parcel-hpc reconcile --help`")
    if args.since is not None:
        raise UsageError("--since goes with --account NAME: a search's own reconcile covers all of its jobs")

    def one_pass() -> tuple[list, int]:
        results = [search_report.reconcile_search(SearchDir(d), args.sacct_file) for d in args.search_dirs]
        return results, sum(len(r.pending) for r in results)

    results, pending = _reconciled(one_pass, args.wait, retry=args.sacct_file is None)
    return _print_report(
        args,
        pending,
        lambda: search_report.json_chunks(results),
        lambda: search_report.csv_chunks(results),
        lambda console: search_report.render_table(results, console),
        lambda: search_report.to_html(results),
    )


def _many(args: argparse.Namespace) -> int:
    """``--root`` / ``--account``: the admin's report over many searches."""
    # Imported here: Hydra (the configured root) and the account report's page cost a search's
    # reconcile a quarter of a second it does not need.
    from parcel_hpc.accounting import account_report
    from parcel_hpc.config import configured_search_root

    if args.search_dirs or args.sacct_file is not None:
        raise UsageError("--root and --account report over every search they find: give no SEARCH_DIR and no --sacct-file with them")
    if args.account is not None and args.since is None:
        raise UsageError("--account needs --since DATE (YYYY-MM-DD): the report covers the account's jobs from then")
    if args.account is None and args.since is not None:
        raise UsageError("--since goes with --account NAME")
    since = account_report.parse_since(args.since) if args.since is not None else None
    if args.account is not None:
        _require_known_account(args.account)  # a misspelt account would read as an idle one: 0 jobs
    root = args.root if args.root is not None else configured_search_root()

    def one_pass() -> tuple[Any, int]:
        report = account_report.account_report(root, args.account, since)
        return report, report.pending

    report, pending = _reconciled(one_pass, args.wait)
    return _print_report(
        args,
        pending,
        report.json_chunks,
        lambda: account_report.csv_chunks(report),
        lambda console: account_report.render_table(report, console),
        lambda: account_report.to_html(report),
    )


NAMES_SHOWN = 20  # of the accounts an unknown --account is told to choose from


def _require_known_account(account: str) -> None:
    """UsageError (one line, exit 2) unless the accounting database has an association for ``account``."""
    known = sorted({a for b in BACKENDS for a in b.known_accounts()})
    if account not in known:
        shown = ", ".join(known[:NAMES_SHOWN]) + (f" and {len(known) - NAMES_SHOWN} more (sacctmgr show accounts)" if len(known) > NAMES_SHOWN else "")
        raise UsageError(f"--account {account} is not an account the scheduler knows; give one of {shown or 'none: the accounting database has no account'}")


def _reconciled(one_pass: Callable[[], tuple[Any, int]], wait_s: float, retry: bool = True) -> tuple[Any, int]:
    """``one_pass()`` -> (report, jobs pending), again every ``RETRY_S`` while jobs are pending and
    ``wait_s`` is not spent; the last (report, pending)."""
    deadline = time.monotonic() + wait_s
    while True:
        report, pending = one_pass()
        left = deadline - time.monotonic()
        if not pending or left <= 0 or not retry:
            return report, pending
        time.sleep(min(RETRY_S, left))


def _print_report(
    args: argparse.Namespace,
    pending: int,
    as_json: Callable[[], Iterable[bytes | memoryview]],
    as_csv: Callable[[], Iterable[bytes | memoryview]],
    as_table: Callable[[Console], None],
    as_html: Callable[[], str],
) -> int:
    """The report in the form asked for (and ``--html`` beside it); exit 4 while jobs are pending."""
    if args.json or args.csv:
        sys.stdout.flush()
        out = sys.stdout.buffer
        try:
            for chunk in as_json() if args.json else as_csv():  # written as made: a month's lines are never all held
                out.write(chunk)
            out.write(b"\n" if args.json else b"")
            out.flush()
        except BrokenPipeError:  # the reader left (`| head`): the page and the exit code still follow
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    else:
        as_table(make_console())
    if args.html:
        fsio.write_output(args.html, as_html().encode(), "--html")
        print(f"wrote {args.html}", file=sys.stderr)
    if pending:
        print(f"pending: {pending} jobs are not yet accounted in full; rerun, or pass --wait SECONDS", file=sys.stderr)
        return EXIT_PENDING
    return 0
