"""The release packet: everything a reviewer needs to accept a search's result, as one JSON value.

Built from records only (the ledger, the selection's results and the records of its jobs, the
budget journal, sacct when the search ran on SLURM); it runs no model. ``checks`` is the registry
gate: the artifact is registered only when every check passed or, for the slice gate, a
documented decision accepted it (``outcome_of``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from parcel_hpc.accounting import search_report as accounting
from parcel_hpc.accounting.spend import read_spend, search_spend
from parcel_hpc.budget import BudgetLedger, search_caps
from parcel_hpc.data import SplitMethod
from parcel_hpc.errors import SchedulerUnavailable, UsageError
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import SearchDir, TrialRecord, TrialSpec, fold, read_events
from parcel_hpc.ledger.summary import counts_by_state
from parcel_hpc.propose.specs import sampler_of, space_of
from parcel_hpc.scheduler.registry import BACKENDS
from parcel_hpc.selection.actions import Assessment, assess
from parcel_hpc.selection.candidates import TrialFacts, lineage_problems
from parcel_hpc.selection.gates import GATES, Check, release_outcome
from parcel_hpc.selection.policy import SelectionPolicy
from parcel_hpc.selection.store import SelectionStore

REGISTERED = Outcome.RELEASE_REGISTERED


def build(store: SelectionStore, facts: Sequence[TrialFacts], *, sacct: bool = True) -> dict[str, Any]:
    """``facts``: ``selection.actions.trial_facts`` of the search, read once by the caller."""
    search = store.search
    contract = search.contract()
    policy = SelectionPolicy.of(contract)
    record = store.record()
    n = store.current()
    if n is None:
        raise UsageError(f"{search.path} has no selection; run `parcel-hpc select` first")
    by_id = {f.record.trial_id: f for f in facts}
    records = [f.record for f in facts]
    winner_facts = by_id.get(store.selection(n)["trial_id"])
    # Lineage now, not as frozen: a trial quarantined after an early selection no longer passes.
    lineage_clean = winner_facts is not None and not lineage_problems(winner_facts, contract)
    a = assess(store, record, n, after_final=True, lineage_now=lineage_clean)
    result, final = a.result or {}, a.final
    recorded = {name: _recorded(search, Path(path)) for name, path in result.get("records", {}).items()}
    judgements = {j.gate: j for j in a.verdict.judgements}
    packet = {
        "format": "parcel-release/1",
        "search": {"revision": contract["search_revision"], "path": str(search.path), "contract_digest": contract.digest},
        "built_at": time.time(),
        "counts": counts_by_state(records),
        "compute": _compute(search, records, sacct),
        "selection": {
            "number": a.n,
            "trial_id": a.frozen["trial_id"],
            "metric": a.frozen["metric"],
            "early": a.frozen["early"],
            "reason": a.frozen["reason"],
            "frozen_at": a.frozen["frozen_at"],
            "by": a.frozen["by"],
            "completed": len(a.entries),
            "candidates": sum(e.lineage_ok for e in a.entries),
            "list_digest": a.frozen["list_digest"],
            "disposition": str(a.verdict.outcome),
            "reasons": list(a.verdict.reasons),
            "decisions": [{"by": d.by, "reason": d.reason, "trial_id": d.trial_id, "lifted": str(d.lifted)} for d in a.decisions],
        },
        "lineage": _lineage(contract, winner_facts, a, result, final, store.final_plan(), policy, search),
        "rerun": None
        if a.rerun is None
        else {
            "selected_metric": a.rerun.selected_metric,
            "rerun_metric": a.rerun.rerun_metric,
            "artifact_metric": a.rerun.artifact_metric,
            "tolerance": a.rerun.tolerance,
            "within": a.rerun.within,
            "fold": a.rerun.fold,  # a K-fold winner's: the fold furthest off, judged against its own selected value
        },
        # A K-fold winner's figures fold by fold (selected, its checkpoint rescored, rerun, baseline) and its out-of-fold coverage.
        "folds": result.get("folds"),
        "recorded": {name: _record_summary(r) for name, r in recorded.items()},
        "slices": None
        if a.gate is None
        else {
            "partition": result["slices"]["partition"],  # validation, or a K-fold search's out-of-fold predictions
            "winner": result["slices"]["winner"],
            "baseline": result["slices"]["baseline"],
            "gate": [f.to_json() for f in a.gate.findings],
            "passed": a.gate.passed,
        },
        "artifact": result.get("artifact"),
        "parity": result.get("parity"),
        "serving": result.get("serving"),
        "final": final,
        "final_attempts": [
            {"t": t, "allowed": f.allowed, "retry": f.retry, "outcome": str(f.outcome), "by": f.by, "host": f.host} for t, f in record.final_attempts
        ],
        "final_opened": [{"t": t, "job_id": o.job_id, "host": o.host, "restart_count": o.restart_count} for t, o in record.final_opened],
        "checks": {gate.name: judgements[gate.name].check.value if gate.name in judgements else Check.MISSING.value for gate in GATES},
        # Each check's rule (with the contract's numbers), the numbers it judged and what lifts its hold.
        "gates": [judgements[gate.name].to_json() for gate in GATES if gate.name in judgements],
    }
    packet["outcome"] = str(outcome_of(packet))
    return packet


def outcome_of(packet: Mapping[str, Any]) -> Outcome:
    """``release:registered``, or the hold of the first gate that did not pass or was not decided."""
    return release_outcome({k: Check(v) for k, v in packet["checks"].items()})


def _recorded(search: SearchDir, directory: Path) -> TrialRecord:
    """A selection job's training (the rerun, the baseline), recorded like a trial in the search."""
    return fold(TrialSpec.from_json(search.read_json(directory / "spec.json")), read_events(directory, within=search.path))


def _record_summary(r: TrialRecord) -> dict[str, Any]:
    return {
        "state": r.state.value,
        "metric": r.metric,
        "metric_resume": r.metric_resume.value,
        "step": r.step,
        "params": dict(r.spec.params),
        "config_hash": r.spec.config_hash,
        "attempts": [{"number": x.number, "how": x.how.value if x.how else None, "job_id": x.job_id, "host": x.host} for x in r.attempts],
    }


def _compute(search, records, sacct: bool) -> dict[str, Any]:
    """The search's one spend (``accounting.spend``: trials, packing, selection jobs, held), and
    sacct's account of the same jobs beside it as a reconciliation."""
    spent = read_spend(search, records)
    out: dict[str, Any] = {"spend": spent.to_json(), "line": spent.line(), "sacct": None, "sacct_note": ""}
    if sacct and any(search.job_names(b.executor) for b in BACKENDS if b.files_runs):
        try:
            rec = accounting.reconcile_search(search, None)
            out["sacct"] = {"scheduler": {k: dict(v) for k, v in rec.scheduler.items()}, "flags": rec.flag_count}
        except SchedulerUnavailable as exc:
            out["sacct_note"] = f"sacct unavailable: {exc}"
    else:
        out["sacct_note"] = "The search ran on the local executor: no scheduler accounting."
    return out


def _proposed_by(contract, spec: TrialSpec) -> dict[str, Any]:
    """How the winner was proposed: random index, or the sampler that learned and what it was told."""
    origin = dict(spec.origin or {})
    sampler = sampler_of(contract)
    return {
        "sampler": origin.get("sampler", sampler.name.value),
        "index": origin.get("index", spec.index if origin.get("proposal") is None else None),
        "proposal": origin.get("proposal"),
        "told": origin.get("told"),
        "history_digest": origin.get("history_digest"),
        "options": dict(sampler.options),
        "revision": sampler.revision,
        "space_digest": space_of(contract)[1],
        "replay": "parcel-hpc proposals SEARCH_DIR --replay re-derives it",
    }


def _lineage(contract, winner_facts: TrialFacts | None, a: Assessment, result, final, plan, policy: SelectionPolicy, search) -> dict[str, Any]:
    """The five questions about the selected trial."""
    if winner_facts is None:
        return {}
    r, seen = winner_facts.record, winner_facts.admitted
    software = (result or {}).get("software") or {}
    return {
        "what_ran": {
            "trial_id": r.trial_id,
            "params": dict(r.spec.params),
            "seed": r.spec.seed,
            "config_hash": r.spec.config_hash,
            "contract_digest": contract.digest,
            "trainer": dict(contract["trainer"]),
            "image_digest": seen.image_digest if seen else None,
            "code_version": software.get("code_version"),
            "dependencies": {"environment_digest": software.get("environment_digest"), "key": software.get("key_versions") or {}},
            "seen_by": "the worker's own image digest (admitted event); code and dependencies as the rerun job saw them",
            "proposed_by": _proposed_by(contract, r.spec),
        },
        "on_what_data": {
            "snapshot_digest": seen.snapshot_digest if seen else None,
            "split_digest": seen.split_digest if seen else None,
            "split_revision": contract["split_revision"],
            "split_method": contract["split_method"],
            "boundary": SplitMethod(contract["split_method"]).boundary,
            "preprocessing": dict(contract["preprocessing"]),
            "read_by": "the worker's own digests of the files it opened (admitted event)",
            "selection_job_read": (result or {}).get("observed"),
            "final_partition_digest": plan["final_digest"],
        },
        # A K-fold winner ships its refit: the same params and seed trained on every non-final frame, recorded like a trial.
        "refit": None if (result or {}).get("refit") is None else dict(result["refit"]) | {"params": dict(r.spec.params), "seed": r.spec.seed},
        "how_it_ended": {
            "state": r.state.value,
            "metric": r.metric,
            "metric_resume": r.metric_resume.value,
            "step": r.step,
            "attempts": [
                {"number": x.number, "how": x.how.value if x.how else None, "cause": x.cause.value if x.cause else None, "job_id": x.job_id, "host": x.host}
                for x in r.attempts
            ],
            "jobs": list(r.jobs),
        },
        "what_it_cost": _trial_cost(search, r, contract),
        "what_was_concluded": {
            "scorer": contract["metric_revision"],
            "metric": dict(contract["metric"]),
            "selection_revision": policy.revision,
            "baseline": {
                "name": policy.baseline.name,
                "kind": policy.baseline.kind.value,
                "trainer": dict(policy.baseline.trainer),
                "params": dict(policy.baseline.params),
                "released": None if policy.baseline.artifact is None else asdict(policy.baseline.artifact),
                "validation_metric": (result or {}).get("baseline", {}).get("metric"),
                "fold_metrics": (result or {}).get("baseline", {}).get("fold_metrics"),
            },
            "disposition": str(a.verdict.outcome),
            "decided_by": [d.by for d in a.decisions],
            "final_metric": final["winner"]["metric"] if final else None,
            "final_baseline_metric": final["baseline"]["metric"] if final else None,
        },
    }


def _trial_cost(search, r: TrialRecord, contract) -> dict[str, Any]:
    """The winner's own share of the spend, counted as the search's is (``accounting.spend``)."""
    spent = search_spend([r], BudgetLedger.read(search.path), [], search_caps(contract).rates)
    return {**spent.to_json(), "attempts": len([a for a in r.attempts if a.started is not None])}
