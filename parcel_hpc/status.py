"""``parcel-hpc status``: counts by state and a per-trial table, from the ledger and the scheduler.

Every trial appears, failed and pruned ones included. When the trials' jobs live on SLURM and the
controller answers, running and queued trials show the scheduler's own word (pending, running,
requeued); when it does not answer, the table says so instead of guessing.

Must not write a byte under the search (admins read other people's searches): a trial whose job is
definitely gone is shown resolved, folded in memory and marked not yet recorded (``resolution``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from . import resolution
from .console import make_console
from .ledger import SearchDir, TrialRecord, preview
from .pruning import MilestoneStore
from .report import compute_used, counts_by_state

UNRECORDED = "resolved from the scheduler in this view; not yet recorded (`parcel-hpc sync` records it)"


def collect(search: SearchDir) -> dict[str, Any]:
    """Everything ``status`` shows. Reads only: a search the caller cannot write to gives the same answer."""
    contract = search.contract()
    records, facts = resolution.observe(search, list(search.records()), resolution.DEFINITE)
    resolved = {res.trial_id: res for res in resolution.resolve(records, facts, resolution.DEFINITE)}
    records = [_with(search, r, resolved[r.trial_id]) if r.trial_id in resolved else r for r in records]
    decisions = _prune_decisions(search, contract)
    trials = []
    for r in records:
        row = r.to_json()
        last_job = r.jobs[-1] if r.jobs else ""
        queued = facts.queued.get(last_job)
        row["scheduler"] = queued.state.lower() if queued is not None else ""
        row["prune"] = decisions.get(r.trial_id)
        if r.trial_id in resolved:
            row["unrecorded"] = UNRECORDED
        trials.append(row)
    return {
        "search": str(search.path),
        "contract_digest": contract.digest,
        "counts": counts_by_state(records),
        "compute": compute_used(records),
        "scheduler_error": facts.slurm_error,
        "unrecorded_resolutions": len(resolved),
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
    console.print(f"search {data['search']}  contract {data['contract_digest'][:19]}…")
    console.print("  ".join(f"{k}={v}" for k, v in counts.items()) + f"  (total {sum(counts.values())})")
    if data.get("scheduler_error"):
        console.print(f"[yellow]scheduler not consulted: {data['scheduler_error']}[/]")
    if data.get("unrecorded_resolutions"):
        console.print(f"[yellow]{data['unrecorded_resolutions']} trials' jobs are gone: {UNRECORDED}[/]")
    table = Table()
    for col in ("trial", "state", "scheduler", "metric", "step", "milestone", "attempts", "interrupted", "reason", "prune"):
        table.add_column(col)
    for t in data["trials"]:
        prune = t.get("prune")
        prune_txt = (
            f"{prune['action']}@{prune['milestone']} thr={prune['threshold']:.4f} n={prune['peers']}" + ("" if prune["valid"] else " INVALID")
            if prune and prune.get("threshold") is not None
            else (f"{prune['action']}@{prune['milestone']}" if prune else "")
        )
        table.add_row(
            t["trial_id"],
            t["state"],
            t.get("scheduler", ""),
            "" if t["metric"] is None else f"{t['metric']:.4f}",
            str(t["step"]),
            "" if t["milestone"] is None else str(t["milestone"]),
            str(t["attempts"]),
            str(t["interrupted"]),
            t["reason"][:60],
            prune_txt,
        )
    console.print(table)
    c = data["compute"]
    console.print(f"compute used: {c['gpu_hours']:.4f} GPU-h, {c['cpu_hours']:.4f} CPU-h over {c['attempts']} attempts")


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)
