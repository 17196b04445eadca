"""Run a selection job on the launcher the search's trials ran on, and wait for it.

What the job is (its role, selection, name, resources, time limit, where its output goes) is
decided here; its backend runs it (``Backend.run_selection_job``: a child process locally, a batch
script on SLURM, ``scheduler/slurm/selection.py``) and says whether it still runs. Its result file,
written last by the job, is what says it succeeded. Either way the job is told the search
directory's identity as this command found it (``--owned UID INODE ID``), and holds the directory
to it before it reads, imports or writes anything (``anchor``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from parcel_hpc import anchor, fsio
from parcel_hpc.data import read_split
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import JobRole
from parcel_hpc.ledger.selection import JobSubmitted, SelectionWriter
from parcel_hpc.scheduler.base import LauncherSettings, SelectionJob
from parcel_hpc.scheduler.registry import backend_of
from parcel_hpc.selection.gangs import job_shape
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.worker import WorkerPlan


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    ok: bool
    message: str


def launcher_of(store: SelectionStore) -> LauncherSettings:
    """The launcher of the search's latest launch that dispatched anything."""
    recorded = store.search.last_launcher()
    if recorded is not None:
        return LauncherSettings.from_json(recorded)
    raise UsageError(f"{store.search.path} records no launch that dispatched trials; there is nothing to select from")


def job_time_limit_min(trial_limit_min: int, role: JobRole, folds: int = 1) -> int:
    """The rerun trains two full models (the rerun and the baseline) and measures serving: twice a
    trial's limit and ten minutes more; the final job only scores, within one trial's limit. Of a
    K-fold search (``trial_limit_min`` is then K fold runs'), the rerun trains 2K fold runs and two
    refits on all non-final data: (2K + 2) fold runs' limits and ten minutes more."""
    if role is not JobRole.RERUN:
        return trial_limit_min
    return -(-(2 * folds + 2) * trial_limit_min // folds) + 10 if folds > 1 else 2 * trial_limit_min + 10


def _winner(store: SelectionStore, n: int) -> WorkerPlan | None:
    """Selection ``n``'s trial's plan (None: it selected none)."""
    trial = str(store.selection(n).get("trial_id") or "")
    return WorkerPlan.load(store.search, trial) if trial else None


def job_alive(store: SelectionStore, submitted: JobSubmitted) -> bool | None:
    """Whether a submitted selection job still runs; None when this host cannot tell (a local job
    started on another host)."""
    return backend_of(submitted.executor).selection_job_liveness(submitted.job_id, submitted.host, store.search, submitted.role).as_bool()


def run_job(store: SelectionStore, role: JobRole, n: int, writer: SelectionWriter, console: Console, poll_s: float = 1.0) -> JobOutcome:
    """Run the job on the launcher the trials ran on and wait for it; when one for the same
    selection and role is still running (another ``select`` started it, or this one was
    interrupted), wait for that one instead."""
    settings = launcher_of(store)
    owned = anchor.identify(store.search.path)  # the directory as this command found it: the job holds it to this
    fsio.ensure_dir(store.log_dir(n))
    last = store.record().last_job(n, role)
    if isinstance(last, JobSubmitted) and job_alive(store, last):
        job_id = last.job_id
        console.print(f"{role.value} job {job_id} is already running: waiting for it")
        while job_alive(store, last):
            time.sleep(poll_s)
    else:
        backend = backend_of(settings.kind)
        winner = _winner(store, n)
        folds = read_split(winner.split_path).fold_count if winner is not None else 1
        limit = job_time_limit_min(int(settings.resources["time_limit_min"]), role, folds)
        # A gang's rerun runs as a gang of its winner's own shape; every other job as one rank.
        shape = job_shape(store.search.contract()["resources"], winner.shape if winner is not None and role is JobRole.RERUN else None)
        job = SelectionJob(store.search, owned, role, n, settings, limit, store.log_dir(n), shape)

        def submitted(job_id: str, host: str) -> None:
            writer.job_submitted(n, role, job_id, backend.executor, host)
            console.print(f"{role.value} job {job_id} submitted to the {backend.executor} launcher; waiting for it to end")

        job_id = backend.run_selection_job(job, submitted, poll_s)
    log = store.log_dir(n) / f"{role.value}-{job_id}.out"
    result = store.result(n, role)
    if result is None:
        said = _what_it_said(store, log)
        message = f"the {role.value} job {job_id} ended without a result: {said or 'no output'} (log {log})"
        writer.job_ended(n, role, job_id, False, message=message)
        return JobOutcome(job_id, False, message)
    writer.job_ended(n, role, job_id, True, result["digest"])
    return JobOutcome(job_id, True, "")


def _what_it_said(store: SelectionStore, log: Path) -> str:
    """What a selection job's output file ends with, read as a record is (within the search, only its
    end): the job's own last words (``_own_words``), else its last line; "" when there is none to read.
    A gang's tasks share the file: a peer's traceback may come after rank 0's words."""
    try:
        with fsio.Folder.open(log.parent, within=store.search.path) as folder:
            data, _ = folder.read_tail(log.name, 2**16)
    except (FileNotFoundError, CorruptRecord):
        return ""
    lines = data.decode(errors="replace").strip().splitlines()
    return next((line for line in reversed(lines) if _own_words(line)), lines[-1] if lines else "")


def _own_words(line: str) -> bool:
    """A line ``parcel-hpc selection-job`` prints as it ends without a result: its one-line error, or a
    refusal's outcome with its reason (``errors.exit_on_error``)."""
    if line.startswith("error: "):
        return True
    head, said, _ = line.partition(": ")
    try:
        Outcome.parse(head)
    except ValueError:
        return False
    return bool(said)
