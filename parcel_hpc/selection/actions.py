"""``parcel-hpc select``, ``decide`` and ``evaluate-final``: select once, then evaluate once.

Each command reads the search's records, decides with the pure functions (``candidates``,
``slices``, ``disposition``) and says what it did in the selection journal. A hold exits 3 with
its outcome as the first line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import os
import socket
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, cast

from rich.console import Console
from rich.table import Table

from parcel_hpc.console import safe
from parcel_hpc.errors import ParcelError, UsageError
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.ledger import Admitted, AttemptEnd, JobRole, SearchDir, TrialState
from parcel_hpc.ledger.records import counted_milestones
from parcel_hpc.ledger.selection import Decided, FinalAttempt, Frozen, JobEnded, SelectionRecord, SelectionWriter
from parcel_hpc.ownership import current_user
from parcel_hpc.probe import Liveness, local_process
from parcel_hpc.pruning import MilestoneStore
from parcel_hpc.selection.candidates import Entry, TrialFacts, best_candidate, completed_list, list_digest
from parcel_hpc.selection.disposition import Verdict, disposition
from parcel_hpc.selection.gates import Check, Comparison, Final, GateFacts, JudgedOn, Parity, ParityCheck, RerunCheck
from parcel_hpc.selection.policy import SelectionPolicy
from parcel_hpc.selection.slices import GateResult, SliceRow, overall, slice_gate
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.selection.submit import job_alive, run_job

FINAL_USED = Outcome.reject("final-holdout-used")
MAX_TEXT = 500


# --- facts, read only -----------------------------------------------------------------------------


def trial_facts(search: SearchDir, contract: Contract) -> list[TrialFacts]:
    """Every trial's record, what its scoring attempt read, its prune decisions that used an
    invalidated peer, and its validation curve; each trial's journals are read once."""
    milestones = MilestoneStore(search.path, contract["pruner"]["milestones"], readonly=True)
    out = []
    for record, events in search.histories():
        admitted = None
        if record.state is TrialState.COMPLETED:
            scored = next((a.number for a in reversed(record.attempts) if a.how is AttemptEnd.COMPLETED), None)
            admitted = next((e.data for e in events if isinstance(e.data, Admitted) and e.attempt == scored), None)
        invalid = tuple(
            f"milestone {d.decision.milestone} used {inv.invalid_peer}" for d in milestones.decisions(record.trial_id) if not d.valid for inv in d.invalidations
        )
        curve = sorted({m.step: m.value for _, m in counted_milestones(record, events)}.items())
        out.append(TrialFacts(record, admitted, invalid, tuple(curve)))
    return out


@dataclass(frozen=True)
class Assessment:
    """Everything the disposition of selection ``n`` rests on, and the disposition itself."""

    n: int
    frozen: dict[str, Any]
    entries: tuple[Entry, ...]
    rerun: RerunCheck | None
    result: dict[str, Any] | None  # the rerun job's result
    gate: GateResult | None
    decisions: tuple[Decided, ...]
    final: dict[str, Any] | None  # the final job's result (read only ``after_final``)
    verdict: Verdict


def assess(store: SelectionStore, record: SelectionRecord, n: int, *, after_final: bool = False, lineage_now: bool | None = None) -> Assessment:
    """Selection ``n``'s disposition from its records: the gates ``select`` judges, or with
    ``after_final`` every gate, the final ones too (``release``, and a decision after the final
    evaluation); ``lineage_now``: whether the winner's lineage is still clean (None: not asked)."""
    policy = SelectionPolicy.of(store.search.contract())
    frozen = store.selection(n)
    entries = tuple(Entry(e["trial_id"], e["config_hash"], float(e["metric"]), bool(e["lineage_ok"]), tuple(e["problems"])) for e in frozen["completed"])
    result = store.result(n, JobRole.RERUN)
    rerun = gate = parity = performance = None
    if result is not None:
        folds = result.get("folds")
        if folds is None:
            rerun = RerunCheck(float(frozen["metric"]), float(result["rerun_metric"]), policy.rerun_tolerance, float(result["artifact_metric"]))
        else:
            rerun = RerunCheck.worst_fold(folds["selected"], folds["rerun"], policy.rerun_tolerance, folds["artifact"])
        winner = [SliceRow.from_json(r) for r in result["slices"]["winner"]]
        baseline = [SliceRow.from_json(r) for r in result["slices"]["baseline"]]
        gate = slice_gate(winner, baseline, policy.gate)
        served = result["parity"]
        difference = None if served["max_abs_difference"] is None else float(served["max_abs_difference"])
        parity = ParityCheck(difference, policy.parity_tolerance, str(served.get("problem") or ""))
        performance = Comparison(overall(winner).miss_cost, overall(baseline).miss_cost, policy.performance_margin)
    elif record.job_ended(n, JobRole.RERUN) is not None and frozen["metric"] is not None:
        rerun = RerunCheck(float(frozen["metric"]), None, policy.rerun_tolerance)
    decisions = tuple(d for d in record.decisions.get(n, ()) if d.trial_id == frozen["trial_id"])
    final = store.result(n, JobRole.FINAL) if after_final else None
    matches = Final.matches(final, n, frozen["trial_id"], (result or {}).get("artifact", {}).get("sha256"))
    facts = GateFacts(
        False,  # judged from the frozen list by the disposition
        lineage_now,
        rerun=rerun,
        parity=parity,
        performance=performance,
        slices=gate,
        decided=frozenset(d.lifted for d in decisions),
        final_matches=matches,
        final=None if final is None else Comparison(float(final["winner"]["metric"]), float(final["baseline"]["metric"]), policy.final_performance_margin),
        judged_on=JudgedOn(result["slices"]["partition"]) if result is not None else JudgedOn.VALIDATION,
    )
    verdict = disposition(int(frozen["n_trials"]), int(frozen["budget"]), entries, frozen["trial_id"], facts, after_final=after_final)
    return Assessment(n, frozen, entries, rerun, result, gate, decisions, final, verdict)


# --- select -----------------------------------------------------------------------------------------


def select(search_dir, *, now: bool, trial: str | None, reason: str, console: Console, out: Console) -> Assessment:
    search = SearchDir(search_dir)
    if not (search.path / "contract.json").exists():
        raise UsageError(f"{search.path} is not a search directory (no contract.json); pass <search.root>/<search.revision>")
    contract = search.contract()
    SelectionPolicy.of(contract)
    reason = checked_text("--reason", reason, required=bool(now or trial))
    store = SelectionStore(search)
    _refuse_if_claimed_elsewhere(store)
    writer = store.writer("select")
    record = store.record()
    current = store.current()
    if current is not None and not trial:
        if now:
            raise UsageError(f"selection {current} is already frozen; --now applies to a first selection only")
        n = current
        frozen = store.selection(n)
        if n not in record.selections:  # the freezing process died before it said so
            writer.frozen(_frozen_event(frozen))
        console.print(
            f"selection {n} is frozen: {frozen['trial_id'] or 'no trial'} from {len(frozen['completed'])} completed trials (list {frozen['list_digest'][:19]})",
            markup=False,
        )
    else:
        if record.sealed is not None or store.final_claim() is not None:
            raise GovernanceRefusal(
                FINAL_USED, "the final partition of this revision was claimed; a new selection needs a new search revision and its own final evaluation plan"
            )
        n = _freeze(store, contract, writer, current, now=now, trial=trial, reason=reason, console=console)
        claimed = store.current()
        if store.final_claim() is not None and claimed != n:  # the final evaluation claimed the previous selection while this one froze
            raise GovernanceRefusal(
                FINAL_USED,
                f"the final evaluation of selection {claimed} was claimed while selection {n} froze: selection {n} is void, selection {claimed} stands",
            )
    assessment = assess(store, record, n)
    failure = ""
    if assessment.verdict.outcome != Outcome.HOLD_BUDGET and _needs_rerun(assessment):
        job = run_job(store, JobRole.RERUN, n, writer, console)
        failure = job.message
        assessment = assess(store, store.record(), n)
    writer.disposed(n, assessment.verdict.outcome, assessment.verdict.reasons)
    _announce(assessment, out, failure)
    return assessment


def _refuse_if_claimed_elsewhere(store: SelectionStore) -> None:
    """The revision's final claim (beside the contract) outlives its selection's files: a claimed
    selection whose file is gone was moved aside, and a fresh selection would buy a second final evaluation."""
    claim = store.final_claim()
    if claim is not None and not store.selection_path(int(claim["selection"])).exists():
        raise GovernanceRefusal(
            FINAL_USED,
            f"the final partition of this revision was claimed for selection {claim['selection']} ({store.final_claim_path}), whose "
            f"{store.selection_path(int(claim['selection'])).name} is gone from {store.dir}; restore it. A new selection needs a new search revision",
        )


def _needs_rerun(a: Assessment) -> bool:
    lineage_ok = any(e.trial_id == a.frozen["trial_id"] and e.lineage_ok for e in a.entries)
    return lineage_ok and a.result is None


def _freeze(
    store: SelectionStore, contract: Contract, writer: SelectionWriter, current: int | None, *, now: bool, trial: str | None, reason: str, console: Console
) -> int:
    search = store.search
    facts = trial_facts(search, contract)
    budget = int(contract["budget"]["max_trials"])
    finished = [f for f in facts if f.record.state.is_finished()]
    at_cap = len(finished) == len(facts) and (len(facts) >= budget or any(f.record.state is TrialState.BUDGET_EXHAUSTED for f in facts))
    if not at_cap and not now and current is None:
        raise UsageError(
            f"{search.path} has {len(finished)} of {budget} trials finished; select at the budget cap, "
            "or now with --now --reason TEXT (recorded as an early selection)"
        )
    entries = completed_list(facts, contract)
    if trial:
        chosen = next((e for e in entries if e.trial_id == trial), None)
        if chosen is None:
            raise UsageError(f"--trial {trial} is not a completed trial of {search.path}; pick one from `parcel-hpc status`")
    else:
        chosen = best_candidate(entries) or (entries[0] if entries else None)
    n = max(store.frozen_numbers(), default=0) + 1
    frozen = {
        "selection": n,
        "search_revision": contract["search_revision"],
        "contract_digest": contract.digest,
        "frozen_at": time.time(),
        "by": current_user(),
        "early": not at_cap,  # before the budget cap: with --now, or a --trial reselection
        "reason": reason,
        "replaces": current,
        "n_trials": len(facts),
        "budget": budget,
        "finished": len(finished),
        "completed": [e.to_json() for e in entries],
        "list_digest": list_digest(entries),
        "trial_id": chosen.trial_id if chosen else "",
        "metric": chosen.metric if chosen else None,
    }
    if not store.freeze(n, frozen):
        raise UsageError(f"selection {n} was frozen by another process a moment ago; run select again to continue it")
    writer.frozen(_frozen_event(frozen))
    console.print(
        f"selection {n} frozen: {frozen['trial_id'] or 'no trial'} from {len(entries)} completed trials, list {frozen['list_digest'][:19]}", markup=False
    )
    return n


def _frozen_event(frozen: dict[str, Any]) -> Frozen:
    listed = frozen["completed"]
    return Frozen(
        frozen["selection"],
        frozen["trial_id"],
        frozen["metric"],
        frozen["list_digest"],
        len(listed),
        sum(bool(e["lineage_ok"]) for e in listed),
        bool(frozen["early"]),
        frozen["reason"],
        frozen["by"],
    )


def _announce(a: Assessment, out: Console, failure: str = "") -> None:
    """The outcome first (scripts match on it), then the evidence; ``failure``: why the rerun job
    this command ran ended without a result (its own one line)."""
    out.print(str(a.verdict.outcome), markup=False)
    for reason in a.verdict.reasons:
        out.print(f"  {reason}", markup=False, soft_wrap=True)  # never folded: scripts and people read a rule whole
    if a.rerun is not None:
        # A rerun that produced no result is not outside a tolerance: the job's own line says why it ended.
        verdict = "" if a.rerun.rerun_metric is None else f" -> {'within' if a.rerun.within else 'OUTSIDE'} tolerance"
        out.print(f"  rerun: {a.rerun.describe()}{verdict}", markup=False)
    if failure:
        out.print(f"  {failure}", markup=False, soft_wrap=True)
    if a.verdict.judgements:
        shown = ", ".join(f"{j.gate} {j.check.value if j.check.clears or j.check is Check.MISSING else j.check.value.upper()}" for j in a.verdict.judgements)
        out.print(f"  checks: {shown}", markup=False)
    parity = next((j for j in a.verdict.judgements if j.gate == Parity.name and j.found), None)
    if parity is not None:  # the model as served: built without examples, given the artifact's state
        out.print(f"  serving parity: {parity.found}", markup=False, soft_wrap=True)
    if a.result is not None:
        base = a.result["baseline"]
        how = f"released {base['released']}" if base.get("released") else f"trained, {base.get('trainer') or 'the search trainer'}"
        judged = a.result["slices"]["partition"]  # validation, or a K-fold search's out-of-fold predictions
        out.print(f"  baseline {base['name']} ({how}): {judged} miss-cost {base['metric']:.4f}; selected {a.frozen['metric']:.4f}", markup=False)
    if a.gate is not None:
        table = Table(title=f"slice gate, {judged} (selection {a.n})")
        for col in ("slice", "check", "winner", "baseline", "limit", "verdict"):
            table.add_column(col)
        for f in a.gate.findings:
            if not f.passed or f.check == "min_recall":
                table.add_row(
                    safe(f"{f.column}={f.value}"),
                    f.check,
                    "–" if f.winner is None else f"{f.winner:.3f}",
                    "" if f.baseline is None else f"{f.baseline:.3f}",
                    f"{f.limit:g}",
                    "pass" if f.passed else "FAIL",
                )
        table.caption = f"{len(a.gate.findings)} checks, {len(a.gate.failures)} failed (failures and value thresholds shown)"
        out.print(table)
    for d in a.decisions:
        out.print(f"  decided by {d.by}: {d.reason}", markup=False)


# --- decide -------------------------------------------------------------------------------------------


def decide(search_dir, *, by: str, reason: str, out: Console) -> Assessment:
    """Lift the selection's decidable hold (``Outcome.is_decidable``) for its trial, recorded with
    who and why: a performance or slice hold before the final evaluation is claimed, the
    final-performance hold after its result is sealed. Nothing else is lifted by a decision."""
    by = checked_text("--by", by, required=True)
    reason = checked_text("--reason", reason, required=True)
    store = SelectionStore(SearchDir(search_dir))
    record = store.record()
    n = store.current()
    if n is None:
        raise UsageError(f"{store.search.path} has no selection; run `parcel-hpc select` first")
    claimed = record.sealed is not None or store.final_claim() is not None
    if claimed:
        _refuse_if_claimed_elsewhere(store)  # the claimed selection's file moved aside: nothing to decide on
    a = assess(store, record, n, after_final=claimed)
    hold = a.verdict.outcome
    if claimed and hold != Outcome.HOLD_FINAL_PERFORMANCE:
        raise GovernanceRefusal(
            FINAL_USED, f"the final evaluation is claimed and selection {a.n} is {hold}; a decision now lifts only {Outcome.HOLD_FINAL_PERFORMANCE}"
        )
    if not hold.is_decidable:
        raise UsageError(
            f"selection {a.n} ({a.frozen['trial_id']}) is {hold}; a decision lifts only {Outcome.HOLD_PERFORMANCE} and {Outcome.HOLD_SLICE_QUALITY} "
            f"(and {Outcome.HOLD_FINAL_PERFORMANCE} after the final evaluation)"
        )
    holding = a.verdict.holding
    if holding is None or holding.check is Check.MISSING:
        raise UsageError(f"selection {a.n} has no evidence for its {hold} yet; run `parcel-hpc select` to finish it before deciding")
    writer = store.writer("decide")
    writer.decided(Decided(a.n, a.frozen["trial_id"], hold, by, reason))
    a = assess(store, store.record(), a.n, after_final=claimed)
    if claimed:  # the selection's disposition was settled before the claim: the decision is the record
        out.print(f"decided: {hold} lifted for {a.frozen['trial_id']} by {by}", markup=False)
        out.print(f"  {holding.found}", markup=False)
        out.print(f"  next: parcel-hpc release {store.search.path}", markup=False)
        return a
    writer.disposed(a.n, a.verdict.outcome, a.verdict.reasons)
    _announce(a, out)
    return a


# --- evaluate-final ---------------------------------------------------------------------------------


def evaluate_final(search_dir, *, console: Console, out: Console) -> dict[str, Any]:
    store = SelectionStore(SearchDir(search_dir))
    record = store.record()
    n = store.current()
    if n is None:
        raise UsageError(f"{store.search.path} has no selection; run `parcel-hpc select` first")
    plan = store.final_plan()  # a search without a plan is bad input, before anything is logged
    writer = store.writer("evaluate-final")
    who, host, pid = current_user(), socket.gethostname(), os.getpid()

    def refuse(outcome: Outcome, detail: str) -> GovernanceRefusal:
        writer.final_attempt(FinalAttempt(n, False, outcome, who, host, pid))
        return GovernanceRefusal(outcome, detail)

    claim = store.final_claim()
    journaled = record.sealed is not None or any(attempt.allowed for _, attempt in record.final_attempts)
    if claim is None and journaled:
        # Its claim files were moved aside by hand: the selection journal still says the final partition was looked at.
        raise refuse(
            FINAL_USED,
            f"the selection journal in {store.dir} records this revision's final evaluation, but {store.final_claim_path.name} is gone from "
            f"{store.search.path}: it was moved aside; restore it. It is evaluated once: a new search revision needs its own final evaluation plan",
        )
    if claim is not None:
        why_not = _why_not_again(store, record, claim, writer)
        if why_not:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(claim["claimed_at"])))
            raise refuse(
                FINAL_USED,
                f"the final partition of {plan['search_revision']} was claimed for evaluation on {when} by {claim['by']}@{claim['host']} "
                f"(selection {claim['selection']}): {why_not}. It is evaluated once: a new search revision needs its own final evaluation plan",
            )
        _refuse_if_claimed_elsewhere(store)
    a = assess(store, record, n)
    if a.verdict.outcome != Outcome.EVALUATE_FINAL:
        raise refuse(a.verdict.outcome, "; ".join(a.verdict.reasons))
    if claim is None:
        if not store.claim_final({"selection": n, "trial_id": a.frozen["trial_id"], "claimed_at": time.time(), "by": who, "host": host, "pid": pid}):
            raise refuse(FINAL_USED, "another process claimed the final evaluation a moment ago; it is evaluated once")
        newest = max(store.frozen_numbers())
        if newest != n:
            console.print(f"selection {newest} froze while this evaluation claimed selection {n}: the claim fixes selection {n}, selection {newest} is void")
    writer.final_attempt(FinalAttempt(n, True, Outcome.EVALUATE_FINAL, who, host, pid, retry=claim is not None))
    job = run_job(store, JobRole.FINAL, n, writer, console)
    if not job.ok:
        raise ParcelError(f"{job.message}; the claim stands: `parcel-hpc evaluate-final` runs the same claimed evaluation again")
    result = cast(dict[str, Any], store.result(n, JobRole.FINAL))  # job.ok: run_job found it written
    writer.final_sealed(n, result["trial_id"], result["digest"])
    out.print(str(Outcome.EVALUATE_FINAL), markup=False)
    out.print(
        f"  final partition ({result['final_examples']} frames, {plan['final_digest'][:19]}): {result['trial_id']} miss-cost {result['winner']['metric']:.4f}, "
        f"baseline {result['baseline']['metric']:.4f}; sealed {result['digest'][:19]}",
        markup=False,
    )
    return result


def _why_not_again(store: SelectionStore, record: SelectionRecord, claim: dict[str, Any], writer: SelectionWriter) -> str:
    """Why the claimed evaluation may not run again; "" when its job ended without a result and
    nothing of it still runs (the same claimed evaluation of the same artifacts may then run again)."""
    n = int(claim["selection"])
    result = store.result(n, JobRole.FINAL)
    if result is not None:
        if record.sealed is None:  # the evaluating process died between the result and its seal
            writer.final_sealed(n, result["trial_id"], result["digest"])
        return f"its result is sealed ({result['digest'][:19]})"
    last = record.last_job(n, JobRole.FINAL)
    if last is None:  # claimed; the claiming process may still be submitting its job
        claimant = local_process(str(claim.get("pid", "")), str(claim.get("host", "")))
        if claimant is Liveness.UNKNOWN:
            return f"no job is recorded yet; if the claiming process ({claim.get('host')} pid {claim.get('pid')}) is gone, run evaluate-final on that host"
        return f"the claiming process (pid {claim.get('pid')}) is still starting it" if claimant is Liveness.ALIVE else ""
    if isinstance(last, JobEnded):
        return "" if not last.ok else f"job {last.job_id} ended with a result"
    alive = job_alive(store, last)
    if alive is None:
        return f"job {last.job_id} runs on {last.host}; only that host can tell whether it still does"
    return f"job {last.job_id} is evaluating it now" if alive else ""


# --- input ---------------------------------------------------------------------------------------------


def checked_text(option: str, value: str | None, *, required: bool) -> str:
    """One line of printable text (it is recorded and shown to reviewers); ``required``: not empty."""
    text = (value or "").strip()
    if required and not text:
        raise UsageError(f"{option} is required here; say it in words, e.g. {option} 'crushed_corner loss accepted: retrain planned'")
    if any(unicodedata.category(ch)[0] == "C" for ch in text):
        raise UsageError(f"{option} holds a control character or line break; give one line of plain text")
    if len(text) > MAX_TEXT:
        raise UsageError(f"{option} is {len(text)} characters; keep it to {MAX_TEXT} (link a document for more)")
    return text
