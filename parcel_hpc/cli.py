"""``parcel-hpc``: every subcommand that is not the launch. Parsing only; each command calls a module."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import fsio
from .cli_errors import exit_on_error
from .console import make_console
from .errors import EXIT_PENDING, UsageError
from .ledger import SearchDir

# Each subcommand's module is imported when that command runs, not here: they pull in h5py,
# pyarrow, matplotlib and submitit, and `parcel-hpc status` should not pay for all of them.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, like every other bad input
        print(f"error: {message}; see `parcel-hpc {self.prog.split()[-1] if ' ' in self.prog else ''} --help`".replace("  ", " "), file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="parcel-hpc", description="Governed model searches on SLURM clusters (the search itself: python -m parcel_hpc.launch -m).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("make-snapshot", help="write the synthetic parcel snapshot and its splits")
    s.add_argument("out_dir", type=Path)
    s.add_argument("--seed", type=int, default=0)

    s = sub.add_parser("check-trainer", help="check a trainer against the interface a search relies on (resume, determinism, serving parity)")
    s.add_argument("target", metavar="PACKAGE.MODULE:NAME")
    s.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a trial parameter (repeat); VALUE is JSON or text")
    s.add_argument("--data", type=Path, default=Path("data"), metavar="DIR", help="snapshot and split directory (default %(default)s)")
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--steps", type=int, default=12, metavar="N", help="steps before and after the checkpoint (default %(default)s)")
    s.add_argument("--preprocessing", default="stats-r1", metavar="REVISION", help="feature revision (default %(default)s)")

    s = sub.add_parser("status", help="counts by state and a per-trial table")
    s.add_argument("search_dir", type=Path)
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--watch", action="store_true", help=f"follow it until it ends (exit 0) or nothing can move it (exit {EXIT_PENDING}); lines when not a terminal"
    )
    s.add_argument(
        "--interval", type=float, default=10.0, metavar="SECONDS", help="--watch: seconds between looks (default %(default)s; each look asks squeue once)"
    )

    s = sub.add_parser("list", help="every search under a root: counts by state, spend against caps, launcher, last activity")
    s.add_argument("root", type=Path, nargs="?", metavar="ROOT", help="where searches live (default: the configured search.root)")
    s.add_argument("--json", action="store_true", help="print one JSON object")

    s = sub.add_parser("export", help="the trials as a table for pandas: one row per trial (or --attempts), typed columns")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--format", choices=["csv", "parquet", "jsonl"], default="csv", help="default %(default)s")
    s.add_argument("--attempts", action="store_true", help="one row per attempt instead of per trial")
    s.add_argument("--output", "-o", type=Path, metavar="FILE", help="write here instead of stdout")

    s = sub.add_parser("proposals", help="how each trial was proposed, and with --replay whether every proposal re-derives exactly")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--replay", action="store_true", help="re-derive each proposal from what it was drawn from; exit 1 at the first that differs")
    s.add_argument("--json", action="store_true", help="print one JSON object")

    s = sub.add_parser("sync", help="record how trials whose jobs vanished ended (for a search whose launcher has gone)")
    s.add_argument("search_dir", type=Path)

    s = sub.add_parser("resubmit", help="rerun trials whose jobs ended without a result for infrastructure reasons")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
    s.add_argument("--wait", action="store_true", help="follow the resubmitted trials until they end")

    s = sub.add_parser("cancel", help="stop the search (or --trial ones) for good: never retried or resubmitted; budget holds settled")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--trial", action="append", default=[], metavar="TRIAL_ID", help="cancel only this trial (repeat); default: the whole search")
    s.add_argument("--reason", default="", metavar="TEXT", help="why, in one line (recorded with your user name)")
    s.add_argument("--wait", type=float, default=60.0, metavar="SECONDS", help="how long to wait for the jobs to end (default %(default)s)")

    s = sub.add_parser("reconcile", help="reconcile sacct accounting with the ledger and the budget (for admins)")
    s.add_argument("search_dirs", type=Path, nargs="*", metavar="SEARCH_DIR")
    s.add_argument("--root", type=Path, metavar="ROOT", help="every search under ROOT, totalled by user, search and partition")
    s.add_argument("--account", metavar="NAME", help="every job charged to this SLURM account (all users) since --since, matched to the searches under --root")
    s.add_argument("--since", metavar="DATE", help="with --account: from this date (YYYY-MM-DD or ISO date and time; UTC unless it says)")
    s.add_argument("--sacct-file", type=Path, help="an exported `sacct --parsable2 --noheader --duplicates` dump instead of calling sacct")
    out = s.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--csv", action="store_true", help="print one CSV row per attempt")
    s.add_argument("--html", type=Path, metavar="FILE", help="also write a self-contained HTML report with plots")
    s.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=f"wait up to this long for the scheduler to file every job in full; exit {EXIT_PENDING} if some are still pending",
    )

    s = sub.add_parser("schedule-reconcile", help="submit a Slurm job that runs `reconcile --json` on a schedule (for admins)")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--output-dir", type=Path, required=True, metavar="DIR", help="where the script and each run's JSON report and stderr go")
    s.add_argument(
        "--every-min", type=int, default=60, metavar="N", help="minutes between runs; 0: one run, cron submits the written script (default %(default)s)"
    )
    s.add_argument("--partition", default="", metavar="P", help="Slurm partition (default: the cluster's default)")
    s.add_argument("--account", default="", metavar="A", help="Slurm account (default: yours)")
    s.add_argument("--qos", default="", metavar="Q", help="Slurm QOS (default: the account's)")
    s.add_argument("--time-limit-min", type=int, default=15, metavar="M", help="time limit of each run in minutes (default %(default)s)")
    s.add_argument("--mem", default="1G", metavar="MEM", help="memory of each run, like 1G (default %(default)s)")
    s.add_argument("--dry-run", action="store_true", help="print the rendered script; write and submit nothing")
    s = sub.add_parser("select", help="freeze the completed list, rerun the winner, retrain the baseline and gate on slices")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--now", action="store_true", help="select before the budget cap (needs --reason; recorded as early)")
    s.add_argument("--trial", metavar="TRIAL_ID", help="a new selection of this trial instead of the best (needs --reason; before the final evaluation only)")
    s.add_argument("--reason", default="", metavar="TEXT", help="why select now, or why another trial")

    s = sub.add_parser("decide", help="record a documented quality decision that lifts hold:slice-quality for the selected trial")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--accept", action="store_true", required=True, help="accept the selected trial despite its failed slice gate")
    s.add_argument("--by", required=True, metavar="NAME", help="who decides")
    s.add_argument("--reason", required=True, metavar="TEXT", help="why, in one line (link a document for more)")

    s = sub.add_parser("evaluate-final", help="evaluate the selected artifact and the baseline once on the protected final partition")
    s.add_argument("search_dir", type=Path)

    s = sub.add_parser("release", help="write the release packet (JSON, Markdown, HTML) and register the artifact when every check passed")
    s.add_argument("search_dir", type=Path)
    s.add_argument("--registry", type=Path, metavar="DIR", help="registry root (default: <search.root>/registry)")

    s = sub.add_parser("selection-job", help="(run by select and evaluate-final as a scheduler job) the model work of a selection")
    s.add_argument("search_dir", type=Path)
    s.add_argument("role", choices=["rerun", "final"])
    s.add_argument("--selection", type=int, required=True, metavar="N")
    return p


def main(argv: list[str] | None = None) -> None:
    fsio.no_world_writes()
    args = _parser().parse_args(argv)
    with exit_on_error():
        if args.command == "make-snapshot":
            _make_snapshot(args)
        elif args.command == "check-trainer":
            _check_trainer(args)
        elif args.command == "status":
            _status(args)
        elif args.command == "list":
            _list(args)
        elif args.command == "export":
            _export(args)
        elif args.command == "proposals":
            _proposals(args)
        elif args.command == "sync":
            _sync(args)
        elif args.command == "resubmit":
            _resubmit(args)
        elif args.command == "cancel":
            _cancel(args)
        elif args.command == "reconcile":
            _reconcile(args)
        elif args.command == "schedule-reconcile":
            _schedule_reconcile(args)
        elif args.command == "select":
            _select(args)
        elif args.command == "decide":
            _decide(args)
        elif args.command == "evaluate-final":
            _evaluate_final(args)
        elif args.command == "release":
            _release(args)
        elif args.command == "selection-job":
            _selection_job(args)


def _make_snapshot(args) -> None:
    from .data import make_default_artifacts

    out = make_default_artifacts(args.out_dir, seed=args.seed)
    for key, value in out.items():
        print(f"{key}: {value}")


def _check_trainer(args) -> None:
    from .errors import UsageError
    from .trainer import conformance

    params = {}
    for item in args.param:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--param {item!r} is not NAME=VALUE; e.g. --param lr=0.01")
        try:
            params[name] = json.loads(text)
        except ValueError:
            params[name] = text
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} must be >= 1")
    ok = conformance.run(
        args.target, args.data, params, seed=args.seed, steps=args.steps, preprocessing={"revision": args.preprocessing, "pool": 4}, console=make_console()
    )
    raise SystemExit(0 if ok else 1)


def _status(args) -> None:
    from . import status

    if args.watch:
        if args.interval <= 0:
            raise UsageError(f"--interval {args.interval:g} must be > 0 seconds")
        raise SystemExit(status.watch(SearchDir(args.search_dir), make_console(), args.interval))
    data = status.collect(SearchDir(args.search_dir))
    if args.json:
        print(status.to_json(data))
    else:
        status.render(data)


def _list(args) -> None:
    from . import searches
    from .config import configured_search_root

    root = args.root if args.root is not None else configured_search_root()
    found = searches.collect(root)
    if args.json:
        print(json.dumps({"root": str(Path(root).absolute()), "searches": [s.to_json() for s in found]}, indent=2))
    else:
        make_console().print(searches.render(found, root))


def _export(args) -> None:
    from . import export

    rows = export.export(SearchDir(args.search_dir), export.Format(args.format), args.output, args.attempts)
    if args.output is not None:
        print(f"wrote {rows} rows to {args.output}", file=sys.stderr)


def _proposals(args) -> None:
    from .sweep import audit

    raise SystemExit(audit.show(SearchDir(args.search_dir), replay=args.replay, as_json=args.json, console=make_console()))


def _sync(args) -> None:
    from . import resolution

    found = resolution.sync(SearchDir(args.search_dir))
    for res in found:
        print(f"{res.trial_id}: attempt {res.attempt} {res.ending.how.value} ({res.ending.cause.value})")
    print(f"recorded {len(found)} resolutions")


def _resubmit(args) -> None:
    from . import resubmit

    resubmit.run(SearchDir(args.search_dir), dry_run=args.dry_run, wait=args.wait, console=make_console())


def _cancel(args) -> None:
    from . import cancel

    if args.wait < 0:
        raise UsageError(f"--wait {args.wait:g} is negative; give seconds to wait for the jobs to end")
    report = cancel.run(SearchDir(args.search_dir), args.trial, args.reason, make_console(), wait_s=args.wait)
    if report.still_alive:
        print(f"pending: {len(report.still_alive)} jobs are still ending; rerun the same cancel to settle their budget", file=sys.stderr)
        raise SystemExit(EXIT_PENDING)


def _reconcile(args) -> None:
    from .accounting import run as accounting

    if args.wait < 0:
        raise UsageError(f"--wait {args.wait:g} is negative; give seconds to wait, or 0 not to wait")
    if args.root is not None or args.account is not None:
        return _reconcile_many(args)
    if not args.search_dirs:
        raise UsageError("reconcile needs SEARCH_DIR ..., --root ROOT, or --account NAME --since DATE; see `parcel-hpc reconcile --help`")
    if args.since is not None:
        raise UsageError("--since goes with --account NAME: a search's own reconcile covers all of its jobs")

    def one_pass():
        results = [accounting.reconcile_search(SearchDir(d), args.sacct_file) for d in args.search_dirs]
        return results, sum(len(r.pending) for r in results)

    results, pending = _reconciled(one_pass, args.wait, retry=args.sacct_file is None)
    _print_report(
        args,
        pending,
        lambda: {"campaigns": [r.to_json() for r in results]},
        lambda: accounting.to_csv(results),
        lambda console: accounting.render_table(results, console),
        lambda: accounting.to_html(results),
    )


def _reconciled(one_pass, wait_s: float, retry: bool = True):
    """``one_pass()`` -> (report, jobs pending), again every 5 s while jobs are pending and
    ``wait_s`` is not spent; the last (report, pending)."""
    deadline = time.monotonic() + wait_s
    while True:
        report, pending = one_pass()
        left = deadline - time.monotonic()
        if not pending or left <= 0 or not retry:
            return report, pending
        time.sleep(min(5.0, left))


def _print_report(args, pending: int, as_json, as_csv, as_table, as_html) -> None:
    """The report in the form asked for (and ``--html`` beside it); exit 4 while jobs are pending."""
    if args.json:
        print(json.dumps(as_json()))  # one line: json's C encoder (indent is pure Python)
    elif args.csv:
        print(as_csv(), end="")
    else:
        as_table(make_console())
    if args.html:
        fsio.atomic_write_text(args.html, as_html())
        print(f"wrote {args.html}", file=sys.stderr)
    if pending:
        print(f"pending: {pending} jobs are not yet accounted in full; rerun, or pass --wait SECONDS", file=sys.stderr)
        raise SystemExit(EXIT_PENDING)


def _reconcile_many(args) -> None:
    """``--root`` / ``--account``: the admin's report over many searches."""
    from .accounting import account_report

    if args.search_dirs or args.sacct_file is not None:
        raise UsageError("--root and --account report over every search they find: give no SEARCH_DIR and no --sacct-file with them")
    if args.account is not None and args.since is None:
        raise UsageError("--account needs --since DATE (YYYY-MM-DD): the report covers the account's jobs from then")
    if args.account is None and args.since is not None:
        raise UsageError("--since goes with --account NAME")
    from .config import configured_search_root

    since = account_report.parse_since(args.since) if args.since is not None else None
    root = args.root if args.root is not None else configured_search_root()

    def one_pass():
        report = account_report.account_report(root, args.account, since)
        return report, report.pending

    report, pending = _reconciled(one_pass, args.wait)
    _print_report(
        args,
        pending,
        report.to_json,
        lambda: account_report.to_csv(report),
        lambda console: account_report.render_table(report, console),
        lambda: account_report.to_html(report),
    )


def _schedule_reconcile(args) -> None:
    from . import scheduled_reconcile

    scheduled_reconcile.run(
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


def _exit_on_hold(verdict) -> None:
    if verdict.outcome.is_hold:
        raise SystemExit(3)  # the outcome was printed first, with its evidence


def _select(args) -> None:
    from .selection import commands

    a = commands.select(args.search_dir, now=args.now, trial=args.trial, reason=args.reason, console=make_console(stderr=True), out=make_console())
    _exit_on_hold(a.verdict)


def _decide(args) -> None:
    from .selection import commands

    a = commands.decide(args.search_dir, by=args.by, reason=args.reason, out=make_console())
    _exit_on_hold(a.verdict)


def _evaluate_final(args) -> None:
    from .selection import commands

    commands.evaluate_final(args.search_dir, console=make_console(stderr=True), out=make_console())


def _release(args) -> None:
    from .release import publish

    packet = publish(args.search_dir, args.registry, out=make_console())
    if not packet["registry_path"]:
        raise SystemExit(3)  # held: the outcome was printed first, with the checks


def _selection_job(args) -> None:
    from .ledger import JobRole
    from .selection import jobs

    result = jobs.run(args.search_dir, JobRole(args.role), args.selection)
    print(f"{args.role} result {result['digest']}")


if __name__ == "__main__":
    main()
