"""A search as MLflow runs (``parcel-hpc export SEARCH --to mlflow``): one parent run per search and
one child run per trial under it, in an experiment named after the search's revision.

A trial's run holds its parameters, its validation miss-cost at every milestone as a metric with
steps and the trainer's own metrics of those steps (``train/<name>``), its state and cause, how its
metric stands against an uninterrupted run's (``parcel.metric_resume``: ``within_tolerance`` never
passes for exact), its attempts and GPU- and CPU-hours (the search's one spend,
``accounting.trials``), its config hash and the contract's digest as tags, and its start and end.
Runs are found again by tags (``parcel.search_key``, ``parcel.trial_id``), so exporting again adds
nothing, and a trial that moved on since (a running one that ended) gets only what is new. Reads
the search only; writes only to the tracking server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parcel_hpc.accounting.trials import TrialRows, trial_rows
from parcel_hpc.integrations.mlflow.client import answering, connect
from parcel_hpc.ledger import SearchDir, TrialState

KIND, SEARCH_KEY, TRIAL_KEY, PARENT = "parcel.kind", "parcel.search_key", "parcel.trial_id", "mlflow.parentRunId"
METRIC = "val_miss_cost"  # at each milestone step; a completed trial's final value also as final_val_miss_cost
SUMMARY = ("attempts", "gpu_hours", "cpu_hours")

# MLflow's run statuses for a trial's state: ended with a result, stopped on purpose, ended without one.
RUN_STATUS = {
    TrialState.QUEUED: "SCHEDULED",
    TrialState.RUNNING: "RUNNING",
    TrialState.COMPLETED: "FINISHED",
    TrialState.PRUNED: "KILLED",
    TrialState.CANCELLED: "KILLED",
    TrialState.FAILED: "FAILED",
    TrialState.QUARANTINED: "SCHEDULED",  # its result set aside: it runs again, cleanly
    TrialState.REJECTED: "FAILED",
    TrialState.BUDGET_EXHAUSTED: "FAILED",
}
ENDED_STATUSES = {"FINISHED", "KILLED", "FAILED"}


@dataclass(frozen=True)
class RunPlan:
    """What one MLflow run should hold (pure: from the trial's rows)."""

    name: str
    status: str
    start_ms: int | None
    end_ms: int | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)  # (key, value, timestamp ms, step)


@dataclass(frozen=True)
class RunsExport:
    experiment: str
    parent_run_id: str
    created: int  # trial runs made by this export
    updated: int  # trial runs that were there and got what is new
    unchanged: int


def trial_plan(trial: TrialRows, key: str, contract_digest: str) -> RunPlan:
    r, row = trial.record, trial.row
    end_ms = row["ended_at"]
    milestones = trial.milestones()
    metrics = [(METRIC, float(m.value), int(t * 1000), int(m.step)) for t, m in milestones]
    # The trainer's own metrics at each validated step, beside the pinned one (which alone decides).
    metrics += [(train_key(name), float(v), int(t * 1000), int(m.step)) for t, m in milestones for name, v in sorted((m.train or {}).items())]
    if end_ms is not None:  # settled figures, stamped with its end: the same on every export
        metrics += [(name, float(row[name] or 0), end_ms, 0) for name in SUMMARY]
        if r.state is TrialState.COMPLETED and r.metric is not None:
            metrics.append((f"final_{METRIC}", float(r.metric), end_ms, int(r.step or 0)))
    tags = {
        KIND: "trial",
        SEARCH_KEY: key,
        TRIAL_KEY: r.trial_id,
        "parcel.state": r.state.value,
        "parcel.metric_resume": r.metric_resume.value,  # within_tolerance: its metric never passes for an exact one
        "parcel.reason": r.reason or "",
        "parcel.cause": r.cause.value if r.cause is not None else "",
        "parcel.config_hash": r.spec.config_hash,
        "parcel.contract_digest": contract_digest,
        "parcel.seed": str(r.spec.seed),
        "parcel.jobs": " ".join(r.jobs),
    }
    return RunPlan(r.trial_id, RUN_STATUS[r.state], row["started_at"], end_ms, {k: str(v) for k, v in sorted(r.spec.params.items())}, tags, metrics)


def train_key(name: str) -> str:
    """The MLflow metric a trainer's own metric is logged as: ``train/<name>``, each character MLflow
    refuses in a key as ``_``."""
    return "train/" + re.sub(r"[^\w\-. :/]", "_", name)


def export_runs(search: SearchDir, uri: str, experiment: str | None = None) -> RunsExport:
    contract = search.contract()
    name = experiment or str(contract["search_revision"])
    key = search.key()
    client = connect(uri)
    trials = list(trial_rows(search))
    plans = [trial_plan(t, key, contract.digest) for t in trials]
    with answering(uri, "failed during the export", "; export again: what is there is kept and not written twice"):
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
        parent = _parent(client, experiment_id, search, key, contract.digest, plans)
        existing = {run.data.tags.get(TRIAL_KEY): run for run in _runs(client, experiment_id, f"tags.`{SEARCH_KEY}` = '{key}' and tags.`{KIND}` = 'trial'")}
        created = updated = 0
        for plan in plans:
            run = existing.get(plan.name)
            if run is None:
                _create(client, experiment_id, parent, plan)
                created += 1
            elif _update(client, run, plan):
                updated += 1
    return RunsExport(name, parent, created, updated, len(plans) - created - updated)


def _parent(client: Any, experiment_id: str, search: SearchDir, key: str, contract_digest: str, plans: list[RunPlan]) -> str:
    """The search's parent run (made once); RUNNING until every trial ended."""
    status = "FINISHED" if plans and all(p.status in ENDED_STATUSES for p in plans) else "RUNNING"
    runs = _runs(client, experiment_id, f"tags.`{SEARCH_KEY}` = '{key}' and tags.`{KIND}` = 'search'")
    if runs:
        run = runs[0]
        if run.info.status != status:
            _set_status(client, run.info.run_id, status, max((p.end_ms for p in plans if p.end_ms is not None), default=None))
        return str(run.info.run_id)
    starts = [p.start_ms for p in plans if p.start_ms is not None]
    tags = {KIND: "search", SEARCH_KEY: key, "parcel.contract_digest": contract_digest, "parcel.search_path": str(search.path)}
    run = client.create_run(experiment_id, start_time=min(starts) if starts else None, tags=tags, run_name=str(search.contract()["search_revision"]))
    _set_status(client, run.info.run_id, status, max((p.end_ms for p in plans if p.end_ms is not None), default=None))
    return str(run.info.run_id)


def _set_status(client: Any, run_id: str, status: str, end_ms: int | None) -> None:
    """An ended run with its end time; one still going without."""
    if status in ENDED_STATUSES:
        client.set_terminated(run_id, status, end_time=end_ms)
    else:
        client.update_run(run_id, status=status)


def _runs(client: Any, experiment_id: str, query: str) -> list[Any]:
    out: list[Any] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=query, max_results=1000, page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def _create(client: Any, experiment_id: str, parent: str, plan: RunPlan) -> None:
    run = client.create_run(experiment_id, start_time=plan.start_ms, tags={**plan.tags, PARENT: parent}, run_name=plan.name)
    _log(client, run.info.run_id, plan.metrics, plan.params)
    _set_status(client, run.info.run_id, plan.status, plan.end_ms)


def _update(client: Any, run: Any, plan: RunPlan) -> bool:
    """What is new since the run was exported (metrics, tags, status, and the params an export that
    died after creating the run left out); False: nothing was."""
    if run.info.status in ENDED_STATUSES and run.info.status == plan.status and run.data.tags.get("parcel.state") == plan.tags["parcel.state"]:
        return False  # ended as exported: a finished trial's record never changes
    logged: set[tuple[str, str, int, int]] = set()  # the value as text: a diverged step's NaN equals itself
    for key in {m[0] for m in plan.metrics}:
        logged |= {(key, repr(float(m.value)), int(m.timestamp), int(m.step)) for m in client.get_metric_history(run.info.run_id, key)}
    metrics = [m for m in plan.metrics if (m[0], repr(m[1]), m[2], m[3]) not in logged]
    params = {k: v for k, v in plan.params.items() if k not in run.data.params}
    tags = {k: v for k, v in plan.tags.items() if run.data.tags.get(k) != v}
    if not metrics and not params and not tags and run.info.status == plan.status:
        return False
    _log(client, run.info.run_id, metrics, params, tags)
    _set_status(client, run.info.run_id, plan.status, plan.end_ms)
    return True


def _log(client: Any, run_id: str, metrics: Iterable[tuple[str, float, int, int]], params: Mapping[str, str], tags: Mapping[str, str] | None = None) -> None:
    """In batches MLflow takes (at most 1000 metrics, 100 params and tags, per call)."""
    from mlflow.entities import Metric, Param, RunTag

    metric_list = [Metric(k, v, t, s) for k, v, t, s in metrics]
    pairs = [Param(k, v) for k, v in params.items()]
    tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
    for i in range(0, len(metric_list), 1000):
        client.log_batch(run_id, metrics=metric_list[i : i + 1000])
    for i in range(0, len(pairs), 100):
        client.log_batch(run_id, params=pairs[i : i + 100])
    for i in range(0, len(tag_list), 100):
        client.log_batch(run_id, tags=tag_list[i : i + 100])
