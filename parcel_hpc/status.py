"""``parcel-hpc status``: counts by state and a per-trial table, from the ledger and the scheduler.

Every trial appears, failed and pruned ones included. When the trials' jobs live on SLURM and the
controller answers, running and queued trials show the scheduler's own word (pending, running,
requeued); when it does not answer, the table says so instead of guessing.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from . import slurm
from .errors import SchedulerUnavailable
from .ledger.records import TrialRecord
from .ledger.store import SearchDir
from .pruning import MilestoneStore
from .report import compute_used, counts_by_state


def collect(search: SearchDir) -> dict[str, Any]:
    contract = search.contract()
    records = list(search.records())
    queue, queue_error = _queue_view(search, records)
    if not queue_error and _resolve_lost(search, records, queue):
        records = list(search.records())
    decisions = _prune_decisions(search, contract)
    trials = []
    for r in records:
        row = r.to_json()
        last_job = r.jobs[-1] if r.jobs else ""
        row["scheduler"] = queue.get(last_job, "") if last_job else ""
        row["prune"] = decisions.get(r.trial_id)
        trials.append(row)
    return {
        "search": str(search.path),
        "contract_digest": contract.digest,
        "counts": counts_by_state(records),
        "compute": compute_used(records),
        "scheduler_error": queue_error,
        "trials": trials,
    }


def _queue_view(search: SearchDir, records: list[TrialRecord]) -> tuple[dict[str, str], str]:
    if not any(_is_slurm(search, r) for r in records if not r.state.is_finished() and r.jobs):
        return {}, ""
    names = search.slurm_job_names()
    view: dict[str, str] = {}
    try:
        for name in names:
            view.update({job: q.state.lower() for job, q in slurm.queued_jobs(name).items()})
    except SchedulerUnavailable as exc:
        return {}, str(exc)
    return view, ""


def _resolve_lost(search: SearchDir, records: list[TrialRecord], queue: dict[str, str]) -> bool:
    """A trial the ledger calls running whose job the scheduler says is gone gets that answer
    journaled (never left running forever). Only a definite answer counts: for SLURM, absent from
    squeue and ended in sacct; locally, the worker's process is gone from this host."""
    import socket

    from .sweep.dispatch import _local_pid_alive

    lost: list[tuple[TrialRecord, str]] = []
    slurm_jobs = []
    for r in records:
        if r.state.value != "running" or not r.jobs or not r.attempts:
            continue
        job = r.jobs[-1]
        if _is_slurm(search, r):
            if job not in queue:
                slurm_jobs.append((r, job))
        elif r.attempts[-1].host == socket.gethostname() and not _local_pid_alive(job) and not _local_pid_alive(str(r.attempts[-1].pid)):
            lost.append((r, "lost"))
    if slurm_jobs:
        from .accounting import attempts, build_sacct_argv, parse_sacct, run_sacct
        from .resubmit import interruption_cause, runs_by_job

        by_job = runs_by_job(attempts(parse_sacct(run_sacct(build_sacct_argv([j for _, j in slurm_jobs])), source="sacct")))
        for r, job in slurm_jobs:
            a = by_job[job][-1] if by_job.get(job) else None
            if a is not None and a.state.is_terminal():
                lost.append((r, interruption_cause(a.state)))
    for r, cause in lost:
        search.journal(r.trial_id, "status").append(
            "resolved", attempt=r.attempts[-1].number, how="lost" if cause == "lost" else "interrupted", cause=cause,
            job_id=r.jobs[-1], message="the scheduler says this attempt's job is gone; resolved by parcel-hpc status")
    return bool(lost)


def _is_slurm(search: SearchDir, record: TrialRecord) -> bool:
    return any(e.get("executor") == "slurm" for e in search.events(record.trial_id) if e["kind"] == "submitted")


def _prune_decisions(search: SearchDir, contract) -> dict[str, dict]:
    if not (search.path / "prune_decisions").exists():
        return {}
    store = MilestoneStore(search.path, contract["pruner"]["milestones"])
    out: dict[str, dict] = {}
    for rec in store.decisions():
        d = rec.decision
        if d.action.stops_trial or d.trial_id not in out:
            out[d.trial_id] = {"milestone": d.milestone, "action": d.action.value, "value": d.value, "threshold": d.threshold,
                               "peers": len(d.peers), "valid": rec.valid}
    return out


def render(data: dict[str, Any], console: Console | None = None) -> None:
    from .sweep.display import make_console

    console = console or make_console()
    counts = data["counts"]
    console.print(f"search {data['search']}  contract {data['contract_digest'][:19]}…")
    console.print("  ".join(f"{k}={v}" for k, v in counts.items()) + f"  (total {sum(counts.values())})")
    if data.get("scheduler_error"):
        console.print(f"[yellow]scheduler not consulted: {data['scheduler_error']}[/]")
    table = Table()
    for col in ("trial", "state", "scheduler", "metric", "step", "milestone", "attempts", "interrupted", "reason", "prune"):
        table.add_column(col)
    for t in data["trials"]:
        prune = t.get("prune")
        prune_txt = f"{prune['action']}@{prune['milestone']} thr={prune['threshold']:.4f} n={prune['peers']}" + ("" if prune["valid"] else " INVALID") if prune and prune.get("threshold") is not None else (f"{prune['action']}@{prune['milestone']}" if prune else "")
        table.add_row(
            t["trial_id"], t["state"], t.get("scheduler", ""), "" if t["metric"] is None else f"{t['metric']:.4f}",
            str(t["step"]), "" if t["milestone"] is None else str(t["milestone"]), str(t["attempts"]), str(t["interrupted"]),
            t["reason"][:60], prune_txt,
        )
    console.print(table)
    c = data["compute"]
    console.print(f"compute used: {c['gpu_hours']:.4f} GPU-h, {c['cpu_hours']:.4f} CPU-h over {c['attempts']} attempts")


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False, default=str)
