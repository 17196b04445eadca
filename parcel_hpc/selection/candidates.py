"""Which completed trials may be selected, and the frozen list a selection is made from (pure).

A candidate is a completed trial with clean lineage: never quarantined or tainted, its result from
an attempt whose worker read exactly the pinned snapshot, split, image and trainer, and no prune
decision it survived used a peer later invalidated. Everything here is a function of typed records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parcel_hpc.governance.contract import Contract, digest_of
from parcel_hpc.ledger import Admitted, TrialRecord, TrialState


@dataclass(frozen=True)
class TrialFacts:
    """What selection needs of one trial: its record, what its scored attempt read, its invalid prune uses."""

    record: TrialRecord
    admitted: Admitted | None  # the ``admitted`` event of the attempt that produced the result
    invalid_prune_uses: tuple[str, ...] = ()  # "milestone 20 used t0007", one per invalidated decision
    curve: tuple[tuple[int, float], ...] = ()  # its validation values by step, tainted attempts left out


@dataclass(frozen=True)
class Entry:
    """One line of the frozen completed list."""

    trial_id: str
    config_hash: str
    metric: float
    lineage_ok: bool
    problems: tuple[str, ...]

    def to_json(self) -> dict:
        return {
            "trial_id": self.trial_id,
            "config_hash": self.config_hash,
            "metric": self.metric,
            "lineage_ok": self.lineage_ok,
            "problems": list(self.problems),
        }


def lineage_problems(facts: TrialFacts, contract: Contract) -> tuple[str, ...]:
    """Why this trial's result cannot be selected; empty when its lineage is clean."""
    r, seen = facts.record, facts.admitted
    out = []
    if r.state is not TrialState.COMPLETED:
        out.append(f"state {r.state.value}")
    if r.quarantines or r.invalid_metrics or r.tainted_upto:
        out.append("quarantined: " + "; ".join(r.quarantines)[:200])
    if seen is None:
        out.append("no record of what its worker read (admitted event missing)")
    else:
        for name, observed, pinned in (
            ("snapshot", seen.snapshot_digest, contract["snapshot_digest"]),
            ("split", seen.split_digest, contract["split_digest"]),
            ("image", seen.image_digest, contract["image_digest"]),
            ("trainer", seen.trainer_digest, dict(contract["trainer"]).get("source_digest")),
        ):
            if observed != pinned:
                out.append(f"its worker read {name} {observed}, the contract pins {pinned}")
    out.extend(f"compared against an invalidated peer ({use})" for use in facts.invalid_prune_uses)
    return tuple(out)


def completed_list(facts: Sequence[TrialFacts], contract: Contract) -> tuple[Entry, ...]:
    """Every completed trial, best first (ties by trial id), each with its lineage verdict."""
    entries = []
    for f in facts:
        if f.record.state is TrialState.COMPLETED:
            assert f.record.metric is not None  # TrialRecord: a completed trial carries its metric
            problems = lineage_problems(f, contract)
            entries.append(Entry(f.record.trial_id, f.record.spec.config_hash, float(f.record.metric), not problems, problems))
    return tuple(sorted(entries, key=lambda e: (e.metric, e.trial_id)))


def list_digest(entries: Sequence[Entry]) -> str:
    return digest_of([e.to_json() for e in entries])


def best_candidate(entries: Sequence[Entry]) -> Entry | None:
    return next((e for e in entries if e.lineage_ok), None)
