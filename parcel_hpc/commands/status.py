"""``parcel-hpc status``: counts by state and a per-trial table, from the ledger and the scheduler.

Every trial appears, failed and pruned ones included. When the trials' jobs live on SLURM and the
controller answers, running and queued trials show the scheduler's own word (pending, running,
requeued); when it does not answer, the table says so instead of guessing.

Must not write a byte under the search (admins read other people's searches): a trial whose job is
definitely gone is shown resolved, folded in memory and marked not yet recorded (``resolution``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from parcel_hpc.accounting.spend import read_spend, shown
from parcel_hpc.console import make_console, plain, safe
from parcel_hpc.errors import EXIT_PENDING, ParcelError
from parcel_hpc.ledger import LauncherState, MetricResume, RecordView, SearchDir, TrialRecord, TrialState, collector_paused, preview, searches
from parcel_hpc.ledger.events import encode_payload
from parcel_hpc.ledger.summary import counts_by_state
from parcel_hpc.lifecycle import resolution
from parcel_hpc.pruning import MilestoneStore
from parcel_hpc.scheduler.base import QueueState

READ_ONLY = True

UNRECORDED = "resolved from the scheduler in this view; not yet recorded (`parcel-hpc sync` records it)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("search_dir", type=Path)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument(
        "--watch", action="store_true", help=f"follow it until it ends (exit 0) or nothing can move it (exit {EXIT_PENDING}); lines when not a terminal"
    )
    parser.add_argument(
        "--interval", type=_seconds, default=10.0, metavar="SECONDS", help="--watch: seconds between looks (default %(default)s; each look asks squeue once)"
    )


def _seconds(text: str) -> float:
    """A number of seconds > 0, refused by the parser (one line, exit 2): NaN and inf too."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0; give one such as 10")
    return value


def run(args: argparse.Namespace) -> int:
    search = SearchDir(args.search_dir)
    if args.watch:
        return watch(search, make_console(), args.interval)
    data = collect(search)
    if args.json:
        print(to_json(data))
    else:
        render(data)
    return 0


@collector_paused()
def collect(search: SearchDir, view: RecordView | None = None) -> dict[str, Any]:
    """Everything ``status`` shows. Reads only: a search the caller cannot write to gives the same
    answer. ``view``: read through it (``--watch`` folds only the trials whose journals changed)."""
    contract = search.contract()
    found = view.records() if view is not None else list(search.records())
    records, facts = resolution.observe(search, found, resolution.DEFINITE)
    spend = read_spend(search, records)  # as recorded: a resolution folded here in memory settles nothing
    resolved = {res.trial_id: res for res in resolution.resolve(records, facts, resolution.DEFINITE)}
    records = [_with(search, r, resolved[r.trial_id]) if r.trial_id in resolved else r for r in records]
    decisions = _prune_decisions(search, contract)
    trials = []
    for r in records:
        row = r.to_json()
        last_job = r.jobs[-1] if r.jobs else ""
        # The queue's word on the job, where that job will still run this trial (a requeued pack
        # passes a trial whose attempt died unannounced: it waits for a job of its own).
        queued = facts.queued.get(last_job) if facts.runs_again(r) else None
        row["scheduler"] = queued.state.value if queued is not None else ""
        row["queue_reason"] = queued.reason if queued is not None and queued.state is QueueState.PENDING else ""
        row["prune"] = decisions.get(r.trial_id)
        row["device_use"] = last_device_use(r)
        if r.trial_id in resolved:
            row["unrecorded"] = UNRECORDED
        trials.append(row)
    return {
        "search": str(search.path),
        "contract_digest": contract.digest,
        # the milestones a trial can reach: those past train.steps never come
        "milestones": [m for m in contract["pruner"]["milestones"] if m <= int(contract["train"]["steps"])],
        "counts": counts_by_state(records),
        "spend": spend.to_json(),
        "spend_line": spend.line(),
        "gpu_line": spend.gpus.line() if spend.gpus.allocated else "",
        "scheduler_error": facts.queue_error,
        "unrecorded_resolutions": len(resolved),
        "hold": search.hold(),
        "trials": trials,
    }


def _with(search: SearchDir, record: TrialRecord, res: resolution.Resolution) -> TrialRecord:
    """The record as it will read once the resolution is recorded (folded in memory, nothing written)."""
    return search.fold(record.spec, search.events(record.trial_id) + [preview(res.attempt, res.ending, time.time())])


def _prune_decisions(search: SearchDir, contract) -> dict[str, dict]:
    if not (search.path / "prune_decisions").exists():
        return {}
    store = MilestoneStore(search.path, contract["pruner"]["milestones"], readonly=True)
    out: dict[str, dict] = {}
    for rec in store.decisions():
        d = rec.decision
        if d.action.stops_trial or d.trial_id not in out:
            out[d.trial_id] = {
                "milestone": d.milestone,
                "action": d.action.value,
                "value": d.value,
                "threshold": d.threshold,
                "peers": len(d.peers),
                "valid": rec.valid,
            }
    return out


def render(data: dict[str, Any], console: Console | None = None) -> None:
    console = console or make_console()
    counts = data["counts"]
    console.print(f"search {safe(data['search'])}  contract {data['contract_digest'][:19]}…")
    console.print("  ".join(f"{k}={v}" for k, v in counts.items()) + f"  (total {sum(counts.values())})")
    if data.get("scheduler_error"):
        console.print(f"[yellow]scheduler not consulted: {safe(data['scheduler_error'])}[/]")
    if data.get("hold"):
        console.print(f"{data['hold']['outcome']}: {data['hold']['detail']}", style="yellow", markup=False, soft_wrap=True)
    if data.get("unrecorded_resolutions"):
        console.print(f"[yellow]{data['unrecorded_resolutions']} trials' jobs are gone: {UNRECORDED}[/]")
    table = Table()
    own = any(t["train_metrics"] for t in data["trials"])  # a trainer that reports none keeps the table as it was
    for col in ("trial", "state", "scheduler", "metric", "step", "milestone", "attempts", "interrupted", "reason", "prune", *(["own metrics"] if own else [])):
        table.add_column(col)
    for t in data["trials"]:
        prune = t.get("prune")
        prune_txt = (
            f"{prune['action']}@{prune['milestone']} thr={prune['threshold']:.4f} n={prune['peers']}" + ("" if prune["valid"] else " INVALID")
            if prune and prune.get("threshold") is not None
            else (f"{prune['action']}@{prune['milestone']}" if prune else "")
        )
        table.add_row(
            safe(t["trial_id"]),
            t["state"],
            safe(t.get("scheduler", "")),
            "" if t["metric"] is None else _metric(t),
            str(t["step"]),
            "" if t["milestone"] is None else str(t["milestone"]),
            str(t["attempts"]),
            str(t["interrupted"]),
            safe(_reason(t)[:100]),
            prune_txt,
            *([safe(_own_metrics(t))] if own else []),
        )
    console.print(table)
    console.print(f"spend: {data['spend_line']}", markup=False, highlight=False)
    if data["gpu_line"]:
        console.print(f"GPUs: {data['gpu_line']}; {_devices_seen(data['trials'])}", markup=False, highlight=False)


def _own_metrics(t: dict[str, Any]) -> str:
    """The trainer's own metrics at its last validated step (``run.stepped``'s): they inform, never decide."""
    return " ".join(f"{name}={value:.4g}" for name, value in sorted(t["train_metrics"].items()))


def last_device_use(record: TrialRecord) -> dict[str, Any] | None:
    """What the trial's last attempt that said so used of its devices, as JSON."""
    use = next((a.device_use for a in reversed(record.attempts) if a.device_use is not None), None)
    return None if use is None else encode_payload(use, drop_empty=False)


def _devices_seen(trials: list[dict[str, Any]]) -> str:
    """Which devices the trials ran on and their largest peak memory, in words."""
    uses = [t["device_use"] for t in trials if t.get("device_use")]
    names = sorted({name for u in uses for name in u["devices"]})
    peaks = [u["peak_memory_bytes"] for u in uses if u["peak_memory_bytes"] is not None]
    peak = f", peak memory {max(peaks) / 2**30:.2f} GiB" if peaks else ""
    return f"on {', '.join(names) or 'devices not recorded'}{peak}"


def _reason(t: dict[str, Any]) -> str:
    """Why a trial is in its state; a failure with its exception type and message (first line)."""
    return f"{t['reason']}: {t['error']}" if t.get("error") else t["reason"]


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)


# --- status --watch ----------------------------------------------------------------------------


def watch(search: SearchDir, console: Console, interval_s: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> int:
    """Follow a search until it ends (exit 0), or until nothing can move it (exit 4): no job runs or
    waits in the queue and no launcher follows it. A terminal gets a live view; anything else (a
    log, a pipe) one line per change. Reads only, like ``status``: it works on a detached SLURM
    search and on someone else's."""
    view = RecordView(search)
    seen: dict[str, tuple] = {}
    live = Live(console=console, auto_refresh=False, transient=False) if console.is_terminal else None
    with live if live is not None else contextlib.nullcontext():
        while True:
            data = collect(search, view)
            launcher = _launcher(search)
            if live is not None:
                live.update(_live_view(data, launcher, console.height), refresh=True)
            else:
                for line in _changes(seen, data):
                    console.print(line, markup=False, highlight=False)
            waiting = [t for t in data["trials"] if not TrialState(t["state"]).is_finished()]
            finished = bool(data["trials"]) and not waiting
            # No trial yet: a launch may be a moment from proposing them (its contract just froze).
            expected = bool(waiting) or time.time() - (search.path / "contract.json").stat().st_mtime > searches.STALE_AFTER_S
            stalled = expected and not finished and not data["scheduler_error"] and not launcher.is_alive() and not _moving(data)
            if finished or stalled:
                break
            sleep(interval_s)
    if live is not None:
        console.print(_counts_line(data), markup=False, highlight=False)  # lines said it already
    if stalled:
        console.print(
            f"stalled: {len(waiting)} trials wait, but no job of this search runs or is queued and no launcher follows it (launcher: {launcher.value});"
            f" rerun the launch, or `parcel-hpc resubmit {search.path}`",
            markup=False,
        )
        return EXIT_PENDING
    return 0


def _launcher(search: SearchDir) -> LauncherState:
    try:
        return searches.current_launcher(search)
    except (ParcelError, OSError):
        return LauncherState.UNKNOWN  # a damaged launch record: the trials' own states still show


def _moving(data: dict[str, Any]) -> bool:
    """Some trial runs, or its job is in the scheduler's queue."""
    return any(t["state"] == TrialState.RUNNING.value or t["scheduler"] for t in data["trials"])


def _milestones(t: dict[str, Any], grid: list[int]) -> str:
    if t["milestone"] is None:
        return f"0/{len(grid)}"
    reached = sum(1 for m in grid if m <= t["milestone"])
    value = "" if t["last_value"] is None else f" ({t['last_value']:.4f} at {t['milestone']})"
    return f"{reached}/{len(grid)}{value}"


def _counts_line(data: dict[str, Any]) -> str:
    counts = data["counts"]
    s = data["spend"]
    return (
        time.strftime("%H:%M:%S ")
        + " ".join(f"{k}={v}" for k, v in counts.items() if v)
        + f" (total {sum(counts.values())}); {shown(s['gpu_hours'])} GPU-h, {shown(s['cpu_hours'])} CPU-h"
    )


def _changes(seen: dict[str, tuple], data: dict[str, Any]) -> list[str]:
    """One line per trial whose state, queue state or milestone changed since the last look, and
    the counts when any did."""
    lines = []
    stamp = time.strftime("%H:%M:%S")
    for t in data["trials"]:
        key = (t["state"], t["scheduler"], t["milestone"])
        before = seen.get(t["trial_id"])
        seen[t["trial_id"]] = key
        if before == key or (before is None and key == (TrialState.QUEUED.value, "", None)):
            continue  # unchanged, or first seen waiting for its dispatch: nothing has happened to it yet
        what = t["state"] + (f" ({t['scheduler']}{': ' + t['queue_reason'] if t['queue_reason'] else ''})" if t["scheduler"] else "")
        if t["metric"] is not None:
            what += f" miss-cost {_metric(t)}"
        elif t["state"] not in ("running", "queued") and t["reason"]:
            what += f": {_reason(t)[:120]}"
        lines.append(f"{stamp} {t['trial_id']} {what}; milestones {_milestones(t, data['milestones'])}")
    if lines:
        lines.append(_counts_line(data))
    return lines


def _metric(t: dict[str, Any]) -> str:
    """A trial's metric, marked where it comes from a resume the contract allowed to drift (``MetricResume``);
    a K-fold trial's, the mean over its folds with their spread and each fold's value."""
    mark = MetricResume(t.get("metric_resume", MetricResume.UNINTERRUPTED.value)).mark()
    folds = t.get("fold_metrics")
    over = f" ±{t['fold_spread']:.4f} over {len(folds)} folds [{' '.join(f'{v:.4f}' for v in folds)}]" if folds else ""
    return f"{t['metric']:.4f}{over}" + (f" ({mark})" if mark else "")


def _live_view(data: dict[str, Any], launcher: LauncherState, height: int) -> Group:
    active = [t for t in data["trials"] if not TrialState(t["state"]).is_finished()]
    done = [t for t in data["trials"] if TrialState(t["state"]).is_finished()]
    best = min((t for t in done if t["metric"] is not None), key=lambda t: t["metric"], default=None)
    header = Text(plain(f"search {data['search']}   launcher: {launcher.value}\n{_counts_line(data)}"))
    if best is not None:
        header.append(plain(f"\nbest so far: {best['trial_id']} miss-cost {_metric(best)}"))
    if data["scheduler_error"]:
        header.append(plain(f"\nscheduler not consulted: {data['scheduler_error']}"), style="yellow")
    table = Table(title=f"{len(active)} trials not finished")
    for col in ("trial", "state", "queue", "milestones", "step", "attempts", "reason"):
        table.add_column(col)
    room = max(3, height - 10)
    for t in active[:room]:
        queue = t["scheduler"] + (f" ({t['queue_reason']})" if t["queue_reason"] else "")
        table.add_row(
            safe(t["trial_id"]), t["state"], safe(queue), _milestones(t, data["milestones"]), str(t["step"]), str(t["attempts"]), safe(t["reason"][:50])
        )
    if len(active) > room:
        table.caption = f"and {len(active) - room} more"
    return Group(header, table)
