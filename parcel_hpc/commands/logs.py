"""``parcel-hpc logs SEARCH_DIR [TRIAL] [--attempt N]``: how a trial's attempt ended, where it ran,
what the scheduler's accounting says of its run (SLURM: sacct's state and node), its traceback from
the ledger, and the scheduler's output files of its job (local and SLURM alike).

Without TRIAL: one line per failed trial, then the first failed trial in full. Without ``--attempt``:
the trial's last failed attempt, else its last. A packed job's files hold every trial it ran.

Must not write a byte under the search (``READ_ONLY``). Reads the output files as records are read
(``fsio.Folder``: a link, a FIFO or a device there is named, never read) and only their end.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from parcel_hpc import fsio
from parcel_hpc.console import make_console
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.ledger import Attempt, AttemptEnd, Ended, SearchDir, TrialRecord
from parcel_hpc.lifecycle import resolution
from parcel_hpc.scheduler.registry import backend_of

READ_ONLY = True

TAIL_LINES = 200  # of each output file: a trainer's log can be long, the end is what broke
TAIL_BYTES = 2**20  # read of each output file's end, whatever its size: 200 lines fit many times over
LINE_CHARS = 2000  # of one line shown: a progress bar rewritten with carriage returns is one line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    parser.add_argument("trial", nargs="?", metavar="TRIAL", help="a trial id (default: the failed trials, the first in full)")
    parser.add_argument("--attempt", type=int, metavar="N", help="the attempt number (default: the last failed attempt, else the last)")


def run(args: argparse.Namespace) -> int:
    search = SearchDir(args.search_dir)
    search.contract()  # not a search directory: one line, exit 2
    console = make_console()
    if args.trial is None:
        if args.attempt is not None:
            raise UsageError(f"--attempt {args.attempt} needs a TRIAL: `parcel-hpc logs {search.path} TRIAL --attempt {args.attempt}`")
        failed = [r for r in search.records() if _failed(r.attempts)]
        if not failed:
            console.print(f"no trial of {search.path} has a failed attempt; `parcel-hpc logs {search.path} TRIAL` shows any trial's last attempt", markup=False)
            return 0
        for r in failed:
            last = _failed(r.attempts)[-1]
            console.print(
                f"{r.trial_id} {r.state.value}: {last.cause.value if last.cause else ''} {last.message}", markup=False, highlight=False, soft_wrap=True
            )
        record = failed[0]
        console.print()
    else:
        ids = search.trial_ids()
        if args.trial not in ids:
            known = f"{ids[0]}..{ids[-1]}" if ids else "none yet"
            raise UsageError(f"trial {args.trial!r} is not in {search.path} (its trials: {known}); `parcel-hpc status {search.path}` lists them")
        record = search.record(args.trial)
    show(search, record, _attempt(search, record, args.attempt), console)
    return 0


def _failed(attempts: Sequence[Attempt]) -> list[Attempt]:
    return [a for a in attempts if a.how is AttemptEnd.FAILED]


def _attempt(search: SearchDir, record: TrialRecord, number: int | None) -> Attempt | None:
    """The attempt asked for (UsageError for one the trial never had), or the default one."""
    if number is not None:
        found = [a for a in record.attempts if a.number == number]
        if not found:
            have = ", ".join(str(a.number) for a in record.attempts) or "none yet"
            raise UsageError(f"trial {record.trial_id} has no attempt {number} (its attempts: {have}); pass one of them to --attempt")
        return found[0]
    failed = _failed(record.attempts)
    return failed[-1] if failed else (record.attempts[-1] if record.attempts else None)


def _ending(search: SearchDir, trial_id: str, number: int) -> Ended | None:
    """What the attempt's ``ended`` (else ``resolved``) event says."""
    endings = [e.data for e in search.events(trial_id) if e.attempt == number and isinstance(e.data, Ended)]
    return endings[0] if endings else None


def show(search: SearchDir, record: TrialRecord, attempt: Attempt | None, console: Console) -> None:
    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    tid = record.trial_id
    if attempt is None:
        if not record.jobs:
            say(f"{tid} ({record.state.value}) was never dispatched: nothing ran, no log exists")
            return
        job = record.jobs[-1]
        say(f"{tid} ({record.state.value}): job {job} never started an attempt (the job ended, or waits, before the worker ran)")
    else:
        job = attempt.job_id or (record.jobs[-1] if record.jobs else "")
        how = attempt.how.value if attempt.how is not None else "no ending recorded"
        cause = f" {attempt.cause.value}" if attempt.cause is not None else ""
        where = f"node {attempt.node} (host {attempt.host or '?'})" if attempt.node and attempt.node != attempt.host else attempt.host or "?"
        say(f"{tid} attempt {attempt.number} of {len(record.attempts)}: {how}{cause} (job {job or '?'} on {where}); trial {record.state.value}")
        if backend_of(record.executor).files_runs and job:
            say(scheduler_word(record, job, attempt.restart_count))
        if attempt.programs:
            say(f"torch.compile's programs, allowed by the fence under Landlock: {', '.join(attempt.programs)}")
        ending = _ending(search, tid, attempt.number)
        if ending is not None and ending.traceback:
            say("--- traceback (from the ledger)")
            say(ending.traceback.rstrip())
        elif ending is not None:
            say(f"--- no traceback recorded: {ending.message or ending.reason or how}")
    if not job:
        return
    shared = [r.trial_id for r in search.records() if job in r.jobs and r.trial_id != tid]
    if shared:
        say(f"job {job} ran {len(shared) + 1} trials in turn (a pack: {tid} {' '.join(shared)}): its files hold them all")
    for path in backend_of(record.executor).job_logs(search, job):
        _tail(search, path, job, say)


def scheduler_word(record: TrialRecord, job: str, run: int) -> str:
    """What sacct says of run ``run`` of ``job`` (the run an attempt ran in: its requeue count):
    its state, node and length; or, in words, why it cannot say (logs goes on without it)."""
    try:
        runs = [r for r in resolution.accounted_runs([record], [job]).get(job, []) if r.attempt == run]
    except UsageError as exc:  # sacct unreachable or refusing: the ledger's word and the files still show
        return f"--- the scheduler: sacct did not answer ({exc})"
    if not runs:
        return f"--- the scheduler: sacct has no record of run {run} of job {job} yet"
    last = runs[-1]
    ran = f"{last.elapsed_s} s so far" if last.state.is_active() else f"{last.elapsed_s} s"
    return f"--- the scheduler (sacct): job {job} run {run} {last.state.text} on {last.node_list or '?'}, {ran}"


def _tail(search: SearchDir, path: Path, job: str, say: Callable[[str], None]) -> None:
    """The end of the job's output file ``path``, read as a record is (within the search: never
    through a link, never a FIFO or a device), and only its last ``TAIL_BYTES`` whatever its size."""
    try:
        with fsio.Folder.open(path.parent, within=search.path) as folder:
            data, size = folder.read_tail(path.name, TAIL_BYTES)
    except FileNotFoundError:
        say(f"--- {path}: not there (submitit writes job {job}'s output there once it starts; a cleaned or moved folder loses it)")
        return
    except CorruptRecord as exc:  # a link, a FIFO, a device where the log should be: named, never read
        say(f"--- not read: {exc}")
        return
    except OSError as exc:  # unreadable (another user's job folder): say so, never a traceback
        say(f"--- {path}: cannot be read ({exc.strerror})")
        return
    lines = data.decode(errors="replace").splitlines()
    if size > len(data):
        lines = lines[1:]  # cut at the start of the bytes read
        cut = f", its last {min(len(lines), TAIL_LINES)} lines (a file of {size} bytes)"
    else:
        cut = f", its last {TAIL_LINES} of {len(lines)} lines" if len(lines) > TAIL_LINES else ""
    say(f"--- {path}{cut}")
    for line in lines[-TAIL_LINES:]:
        say(line if len(line) <= LINE_CHARS else f"{line[:LINE_CHARS]}... ({len(line) - LINE_CHARS} more characters)")
