"""Which search a checkpoint directory (``checkpoint.dir``) belongs to.

    <checkpoint.dir>/parcel-search.json    the search whose trials write their checkpoints here (create-exclusive)

A launch refuses a ``checkpoint.dir`` that another search marked (``refuse_foreign``: exit 2, one
line, before anything is written), and marks it as its own once its contract froze (``mark``). A
directory from before marks is judged by one trial claim in it: its contract. Two searches on one
directory would otherwise meet in a claim, and the quarantine would move the first one's
finished checkpoints away.

Must not: read or write checkpoint files or extend claim chains (``store``, ``claims``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, UsageError

OWNER_FILE = "parcel-search.json"
OWNER_FORMAT = "parcel-checkpoint-dir/1"


@dataclass(frozen=True)
class DirOwner:
    search: str  # the search directory, absolute
    search_id: str  # its id (identity.json); "" for a search frozen before ids
    contract_digest: str


def owner_of(root: str | os.PathLike) -> DirOwner | None:
    path = Path(root) / OWNER_FILE
    if not os.path.lexists(path):
        return None
    found = fsio.read_json(path)
    try:
        if found.pop("format") != OWNER_FORMAT:
            raise ValueError("format")
        return DirOwner(**found)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise CorruptRecord(f"{path} does not say which search owns {root}; move it aside if that directory is this search's alone") from None


def problem(found: DirOwner | None, legacy_contract: str | None, ours: DirOwner) -> str | None:
    """Pure: why ``ours`` may not write its checkpoints where ``found`` (or, unmarked, a claim of
    ``legacy_contract``) did; None when the directory is free or ours."""
    if found is None:
        if legacy_contract is None or legacy_contract == ours.contract_digest:
            return None
        return f"holds trial claims of contract {legacy_contract}, another search's"
    # By id when the mark has one (a new search has none yet: a marked directory is then another's), else by path.
    same = found.search_id == ours.search_id if found.search_id else found.search == ours.search
    if same and found.contract_digest == ours.contract_digest:
        return None
    return f"holds the checkpoints of search {found.search} (id {found.search_id or 'none'}, contract {found.contract_digest})"


def refuse_foreign(root: str | os.PathLike, ours: DirOwner) -> None:
    """UsageError (exit 2) when another search's checkpoints are in ``root``."""
    why = problem(owner_of(root), _legacy_contract(Path(root)), ours)
    if why:
        raise UsageError(
            f"checkpoint.dir={root} {why}; give this search its own checkpoint.dir "
            "(the default, ${search.root}/${search.revision}/checkpoints, is inside the search)"
        )


def mark(root: str | os.PathLike, ours: DirOwner) -> None:
    """Say ``root`` is ``ours`` (once); a mark another search wrote a moment ago is refused as at the door."""
    fsio.ensure_dir(root)
    if not fsio.create_exclusive_json(Path(root) / OWNER_FILE, {"format": OWNER_FORMAT, **asdict(ours)}):
        refuse_foreign(root, ours)


def _legacy_contract(root: Path) -> str | None:
    """The contract of one trial claim in an unmarked directory (all of a search's claims name its
    contract); None when there is none to read."""
    first = next(root.glob("*/claim-000000.json"), None) if root.is_dir() else None
    if first is None:
        return None
    claim = fsio.read_json(first)
    return str(claim.get("contract_digest")) if isinstance(claim, dict) else None
