"""``parcel-hpc proposals SEARCH_DIR [--replay]``: how each trial was proposed, and whether every
proposal re-derives exactly from what it was drawn from. Reads only."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from parcel_hpc.console import safe
from parcel_hpc.governance.contract import Contract
from parcel_hpc.ledger import SearchDir
from parcel_hpc.propose import proposals
from parcel_hpc.propose.samplers import SamplerSpec
from parcel_hpc.propose.specs import sampler_of, space_of


def show(search: SearchDir, *, replay: bool, as_json: bool, console: Console) -> int:
    """Print the proposals (and the replay); the exit code: 1 when a proposal does not re-derive."""
    contract = search.contract()
    sampler = sampler_of(contract)
    rows = _rows(search, contract, sampler)
    replayed = proposals.replay(search, contract) if replay else []
    first = next((r for r in replayed if not r.same), None)
    if as_json:
        out: dict[str, Any] = {"search": str(search.path), "sampler": sampler.to_json(), "space_digest": space_of(contract)[1], "proposals": rows}
        if replay:
            out["replayed"] = len(replayed)
            out["first_difference"] = None if first is None else {"index": first.index, "trial_id": first.trial_id, "difference": first.difference()}
        print(json.dumps(out, indent=2))
    else:
        console.print(_table(rows, sampler))
        if replay:
            if first is None:
                console.print(f"replay: all {len(replayed)} proposals re-derive exactly ({sampler.describe()})")
            else:
                console.print(f"[red]replay: proposal {first.index} ({safe(first.trial_id)}) differs[/]: {safe(first.difference())}", soft_wrap=True)
    return 1 if first is not None else 0


def _rows(search: SearchDir, contract: Contract, sampler: SamplerSpec) -> list[dict]:
    if not sampler.learns:
        return [
            {"index": spec.index, "trial_id": spec.trial_id, "told": None, "history_digest": None, "params": dict(spec.params), "trial": spec.trial_id}
            for spec in map(search.spec, search.trial_ids())
        ]
    rows = []
    known = set(search.trial_ids())
    for k in search.proposal_numbers():
        r = proposals.load(search, k)
        owner = "" if r.trial_id in known else search.config_owner(r.trial(contract).config_hash)
        twin = owner if owner and owner != r.trial_id else ""  # no owner yet: its trial is still being written
        rows.append(
            {
                "index": k,
                "trial_id": r.trial_id,
                "told": len(r.told),
                "history_digest": r.history_digest,
                "params": dict(r.params),
                "trial": r.trial_id if r.trial_id in known else None,  # None: a duplicate, or not written yet
                "duplicate_of": twin or None,
                "launch_id": r.launch_id,
            }
        )
    return rows


def _table(rows: list[dict], sampler: SamplerSpec) -> Table:
    table = Table(title=f"proposals by {sampler.describe()}")
    for col in ("proposal", "trial", "told", "history", "params"):
        table.add_column(col)
    for row in rows:
        trial = f"duplicate of {row['duplicate_of']}" if row.get("duplicate_of") else (row["trial"] or "(trial not written yet)")
        told = "-" if row["told"] is None else str(row["told"])
        history = (row["history_digest"] or "(seed, index)")[:19]
        table.add_row(str(row["index"]), safe(trial), told, safe(history), safe(", ".join(f"{k}={v}" for k, v in row["params"].items())))
    return table
