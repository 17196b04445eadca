"""``parcel-hpc cancel SEARCH_DIR [--trial ID ...]``: stop a search, or some of its trials, for good.

Order is what makes it safe to rerun and safe against a launcher still at work: the cancellation is
recorded first (``cancelled.json`` for the whole search, a ``cancelled`` event per trial), so no
launcher, worker or ``resubmit`` starts anything for those trials after that moment (a worker
started late sees a finished trial and exits before it trains); only then are the jobs signalled,
and once they have left the scheduler each attempt they cut off is recorded ``interrupted`` by its
owner's cancel (``resolution``: sacct's word on its run, when a node failure ended it first) and its
budget hold settled with the hours it ran. A job still ending when cancel stops waiting is left to
``sync`` (or cancel again).
A trial that ended before the cancel keeps its ending. A ``scancel`` by hand is not this: it stays
an infrastructure interruption, retried like a preemption.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from parcel_hpc.console import safe
from parcel_hpc.errors import UsageError
from parcel_hpc.governance import validation
from parcel_hpc.ledger import SearchDir, TrialRecord, TrialState, TrialWriter
from parcel_hpc.lifecycle import resolution, settlement
from parcel_hpc.ownership import current_user
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings
from parcel_hpc.scheduler.factory import make_dispatcher
from parcel_hpc.scheduler.registry import backend_of

JOB_EXIT_WAIT_S = 60.0  # how long cancel waits for signalled jobs to leave the scheduler


@dataclass(frozen=True)
class CancelPlan:
    record: tuple[str, ...]  # trials to mark cancelled now
    signal: tuple[tuple[str, str], ...]  # (trial, latest job) of every cancelled trial: ended if still alive
    untouched: tuple[tuple[str, str], ...]  # (trial, why)
    # (trial, job) where the job is a pack that still runs trials not cancelled: the job goes on, the
    # cancelled trial is skipped, or stops itself at its next milestone if it is the one running.
    shared: tuple[tuple[str, str], ...] = ()


def plan(records: Iterable[TrialRecord], trial_ids: Sequence[str] = ()) -> CancelPlan:
    """Which trials to mark cancelled and whose jobs to end (pure). Empty ``trial_ids``: all of them.
    A trial cancelled before is signalled again (the earlier cancel may have been interrupted)."""
    records = list(records)
    wanted = set(trial_ids)
    record, signal, untouched = [], [], []
    for rec in records:
        if wanted and rec.trial_id not in wanted:
            continue
        if rec.state is TrialState.CANCELLED:
            untouched.append((rec.trial_id, "cancelled before"))
        elif rec.state.is_finished():
            untouched.append((rec.trial_id, f"{rec.state.value} before the cancel: kept"))
            continue
        else:
            record.append(rec.trial_id)
        if rec.jobs:
            signal.append((rec.trial_id, rec.jobs[-1]))
    stopping = set(record)
    kept_open = {rec.jobs[-1] for rec in records if rec.jobs and rec.trial_id not in stopping and not rec.state.is_finished()}
    shared = tuple((t, j) for t, j in signal if j in kept_open)
    signal = [(t, j) for t, j in signal if j not in kept_open]
    return CancelPlan(tuple(record), tuple(signal), tuple(untouched), shared)


def idle_slots(slot_records: Iterable[Mapping[str, Any]], signal: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The job of every slot that runs none of the trials being signalled: one still pending, or
    between trials. Each would start or go on only to see the cancellation and leave (pure)."""
    running = {job for _, job in signal}
    jobs = (str(s.get("job_id", "")) for s in slot_records)
    return tuple(dict.fromkeys(j for j in jobs if j and j not in running))


@dataclass(frozen=True)
class CancelReport:
    plan: CancelPlan
    signalled: tuple[str, ...]  # job ids asked to end
    still_alive: tuple[str, ...]  # job ids still held by the scheduler when cancel stopped waiting
    settled: tuple[tuple[str, int], ...]  # (trial, attempt) budget holds settled
    slots_ended: tuple[str, ...] = ()  # jobs of slots that ran no cancelled trial, asked to end


def run(search: SearchDir, trial_ids: Sequence[str], reason: str, console: Console, wait_s: float = JOB_EXIT_WAIT_S) -> CancelReport:
    search.contract()  # not a search directory: one line, exit 2
    reason = validation.text("--reason", reason or "no reason given", 500)
    known = set(search.trial_ids())
    unknown = sorted(set(trial_ids) - known)
    if unknown:
        raise UsageError(f"--trial {unknown[0]} is not a trial of {search.path}; `parcel-hpc status {search.path}` lists them")
    by = current_user()
    whole = not trial_ids
    writers: dict[str, TrialWriter] = {}

    def writer(tid: str) -> TrialWriter:
        return writers.setdefault(tid, search.writer(tid, "cancel"))

    if whole:
        search.mark_cancelled(by, reason, time.time())  # before any trial event: a launcher checks it first
    decided = plan(search.records(), trial_ids)
    for tid in decided.record:
        writer(tid).cancelled(by, reason, whole)
    dispatcher = _dispatcher(search)
    # Slots outlive their launcher only where the scheduler runs them (a local launcher stops its own).
    idle = idle_slots(search.slot_records(), decided.signal) if whole and dispatcher is not None and dispatcher.can_detach else ()
    waiting = time.monotonic()
    signalled, alive = _end_jobs(dispatcher, [*decided.signal, *(("", j) for j in idle)], wait_s) if dispatcher is not None else ((), ())
    now = time.time()
    gone = {t: now for t, j in decided.signal if j not in alive and _ran_here_or_on_slurm(search, t)}
    if whole:
        # A trial a slot took or proposed after the records above were read: cancelled too, and settled
        # when its slot is one of those just ended.
        late = plan(search.records())
        for tid in late.record:
            writer(tid).cancelled(by, reason, whole)
        gone.update({t: now for t, j in late.signal if j in signalled and j not in alive})
        decided = CancelPlan(decided.record + late.record, decided.signal + late.signal, decided.untouched, decided.shared)
    # An attempt whose job is gone says how it ended now: interrupted by its owner's cancel (never a
    # failure), or what sacct says of its run when something else ended it first (a node failure).
    # No attempt of a cancelled trial is left running in the ledger.
    ended = {j for t, j in decided.signal if t in gone and j not in alive}
    settled, unasked = [], ""
    try:
        records, facts = resolution.observe(search, [search.record(t) for t in sorted(gone)], resolution.RESUBMIT, seen_ending=ended)
        settled = resolution.record(search, resolution.resolve(records, facts, resolution.RESUBMIT), writer)
    except UsageError as exc:  # accounting unreachable: the cancel stands; sync records the endings later
        unasked = f"how the attempts it cut off ended is not recorded ({exc}); `parcel-hpc sync {search.path}` records it once the scheduler answers"
    settled += settlement.settle_ended(search, [search.record(t) for t in sorted(gone)], gone_at=gone)
    # The scheduler's record of the runs it ended (what is left of --wait): their hours settled or
    # restated to sacct's, as a launch's end records them, so reconcile has nothing stale to flag.
    unfiled: list[str] = []
    if not unasked:
        try:
            unfiled = resolution.record_runs_until(search, sorted(gone), writer, max(0.0, wait_s - (time.monotonic() - waiting)))
        except UsageError as exc:
            unasked = f"the scheduler's record of the runs it ended is not recorded ({exc}); `parcel-hpc sync {search.path}` records it once sacct answers"
    slots_ended = tuple(j for j in idle if j in signalled)
    report = CancelReport(decided, signalled, alive, tuple((s.key.trial_id, s.key.attempt) for s in settled), slots_ended)
    console.print(render(report, whole))
    if unasked:
        console.print(unasked, markup=False, highlight=False, soft_wrap=True)
    if unfiled:
        console.print(resolution.provisional_line(search, unfiled), markup=False, highlight=False, soft_wrap=True)
    if slots_ended:
        console.print(f"{len(slots_ended)} slots running no trial were ended: {', '.join(slots_ended)}", markup=False, highlight=False, soft_wrap=True)
    return report


def _dispatcher(search: SearchDir) -> Dispatcher | None:
    recorded = search.last_launcher()
    if recorded is None:
        return None  # nothing was ever dispatched
    dispatcher = make_dispatcher(LauncherSettings.from_json(recorded), search)
    dispatcher.check()  # an unreachable scheduler: one line, exit 2 (the cancellation is already recorded)
    return dispatcher


def _end_jobs(dispatcher: Dispatcher, jobs: Sequence[tuple[str, str]], wait_s: float) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Signal every job still alive; wait up to ``wait_s`` for them to go. (signalled, still alive)."""
    dispatcher.refresh()
    live = [(t, j) for t, j in jobs if dispatcher.alive(t, j)]
    signalled = tuple(j for _, j in live)
    if signalled:
        dispatcher.cancel(signalled)
    deadline = time.monotonic() + wait_s
    while live and time.monotonic() < deadline:
        time.sleep(1.0)
        dispatcher.refresh()
        live = [(t, j) for t, j in live if dispatcher.alive(t, j)]
    return signalled, tuple(j for _, j in live)


def _ran_here_or_on_slurm(search: SearchDir, trial_id: str) -> bool:
    """Whether this host can tell the trial's job has ended (``Backend.judged_here``)."""
    record = search.record(trial_id)
    return not record.attempts or backend_of(record.executor).judged_here(record.attempts[-1])


def render(report: CancelReport, whole: bool) -> Table:
    table = Table(title="cancel: the whole search" if whole else "cancel")
    for col in ("trial", "action", "detail"):
        table.add_column(col)
    p = report.plan
    jobs = dict(p.signal)
    shared = dict(p.shared)
    for tid in p.record:
        if tid in shared:
            table.add_row(
                safe(tid), "cancelled", f"job {safe(shared[tid])} runs other trials too: it goes on, this trial stops at its next milestone or never starts"
            )
            continue
        job = jobs.get(tid)
        how = (
            "never dispatched"
            if job is None
            else f"job {job} " + ("still ending" if job in report.still_alive else "ended" if job in report.signalled else "had already ended")
        )
        table.add_row(safe(tid), "cancelled", safe(how))
    for tid, why in p.untouched:
        table.add_row(safe(tid), "kept", safe(why))
    if report.settled:
        table.caption = f"budget: settled {len(report.settled)} held attempts with the hours they ran"
    if report.still_alive:
        table.caption = (table.caption or "") + f"; {len(report.still_alive)} jobs are still ending: rerun cancel to settle their budget"
    return table
