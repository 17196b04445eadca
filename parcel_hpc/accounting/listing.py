"""The summary of each search under a root (what ``parcel-hpc list`` shows): its revision, counts
by state, its spend (``accounting.spend``) against its caps, whether a launcher still follows it,
and when anything was last written. Finding the searches is ``ledger.searches``'.

Must not write a byte: admins list other people's searches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.accounting.spend import Spend, read_spend
from parcel_hpc.budget import search_caps
from parcel_hpc.ledger import LauncherState, SearchDir
from parcel_hpc.ledger.journal import journals
from parcel_hpc.ledger.searches import UNREADABLE, current_launcher, find_searches, owner_of, problem_of
from parcel_hpc.ledger.summary import best_completed, counts_by_state


@dataclass(frozen=True)
class SearchSummary:
    path: str
    revision: str
    trials: int
    counts: Mapping[str, int]
    spend: Spend | None  # the search's one spend (``accounting.spend``); None when it could not be read
    gpu_hours_cap: float
    cost_cap: float
    launcher: LauncherState
    last_activity: float | None  # newest write to a trial journal or launch record (epoch seconds)
    best: dict | None = None  # the best completed trial: id and validation miss-cost
    problem: str = ""  # why the search could not be read (damaged records): it is still listed
    users: tuple[str, ...] = field(default=())  # the names its launch records give: shown, never whom its spend is charged to
    owner: str = ""  # who owns its directory: the search is theirs, and so is its spend

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "revision": self.revision,
            "trials": self.trials,
            "counts": dict(self.counts),
            "spend": self.spend.to_json() if self.spend is not None else None,
            "caps": {"gpu_hours": self.gpu_hours_cap, "cost": self.cost_cap},
            "launcher": self.launcher.value,
            "last_activity": self.last_activity,
            "best": self.best,
            "owner": self.owner,
            "users": list(self.users),
            "problem": self.problem,
        }


def summarize(search: SearchDir, now: float | None = None) -> SearchSummary:
    now = time.time() if now is None else now
    contract = search.contract()
    caps = search_caps(contract)
    records = list(search.records())
    best = best_completed(records)
    launches = search.launches()
    return SearchSummary(
        path=str(search.path),
        revision=str(contract["search_revision"]),
        trials=len(records),
        counts=counts_by_state(records),
        spend=read_spend(search, records),
        gpu_hours_cap=caps.gpu_hours_cap,
        cost_cap=caps.cost_cap,
        launcher=current_launcher(search, now, launches),
        last_activity=_last_write(search),
        best={"trial_id": best.trial_id, "miss_cost": best.metric} if best else None,
        users=tuple(sorted({str(l["user"]) for l in launches if l.get("user")})),
        owner=owner_of(search),
    )


def _last_write(search: SearchDir) -> float | None:
    """The newest modification among trial journals and launch records: one stat each, no parsing.
    Heartbeats do not count (a live launch over a stuck search would always read "just now"), nor
    temp files, which come and go between the listing and the stat."""
    times = [t for tid in search.trial_ids() for t in _mtimes(search, search.trial_dir(tid), journals)]
    times += _mtimes(search, search.launches_dir, lambda f: [e for e in f.entries() if e.name.endswith(".json") and not e.name.startswith(".")])
    return max(times, default=None)


def _mtimes(search: SearchDir, folder: Path, pick: Callable[[fsio.Folder], list[os.DirEntry[str]]]) -> list[float]:
    """When each entry ``pick`` chooses in ``folder`` was last modified (none while it does not exist)."""
    try:
        with fsio.Folder.open(folder, within=search.path) as opened:
            return [t for e in pick(opened) if (t := _mtime(e)) is not None]
    except FileNotFoundError:
        return []


def _mtime(entry: os.DirEntry[str]) -> float | None:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:  # gone since it was listed
        return None


def collect(root: Path, now: float | None = None) -> list[SearchSummary]:
    """One summary per search; a search whose records do not read (damaged, or not this user's to
    read) is listed with the problem: one bad search never hides the others."""
    out = []
    for search in find_searches(root):
        try:
            out.append(summarize(search, now))
        except UNREADABLE as exc:
            out.append(_unreadable(search, problem_of(exc)))
    return out


def _unreadable(search: SearchDir, problem: str) -> SearchSummary:
    return SearchSummary(str(search.path), search.path.name, 0, {}, None, 0.0, 0.0, LauncherState.NONE, None, problem=problem, owner=owner_of(search))
