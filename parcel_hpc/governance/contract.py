"""The frozen search contract and its digests.

Owns: the canonical form of a search contract, its digest, and freezing it once per search revision
(admission against it is ``admission.py``). Everything here is pure except ``freeze_contract``, which
touches exactly one file (``<search_dir>/contract.json``, created exclusively, never rewritten).

Must not: read Hydra objects (callers pass plain dicts), open data files, or dispatch anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome

CONTRACT_FILE = "contract.json"
CONTRACT_FORMAT = "parcel-contract/1"

# The order in which a differing pinned field is named: data identity first, then how it is
# scored, then what is searched, then where it runs. Fields not listed compare after, sorted.
PINNED_ORDER = (
    "snapshot_digest",
    "split_digest",
    "metric_revision",
    "search_revision",
    "image_digest",
    "trainer",
    "split_method",
    "space",
    "preprocessing",
    "metric",
    "train",
    "resources",
    "budget",
    "pruner",
    "selection",
    "release",
)


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def digest_of(obj: Any) -> str:
    """Digest of a JSON-able value's canonical form."""
    return sha256_of(fsio.canonical_json(obj).encode())


@dataclass(frozen=True)
class Contract:
    """The pinned fields every trial of one search revision shares. ``fields`` is canonical JSON-able."""

    fields: Mapping[str, Any]
    digest: str = ""

    def __post_init__(self) -> None:
        missing = [k for k in ("snapshot_digest", "split_digest", "metric_revision", "search_revision", "image_digest") if not self.fields.get(k)]
        if missing:
            raise GovernanceRefusal(Outcome.reject("identity"), f"contract lacks {', '.join(missing)}")
        object.__setattr__(self, "fields", plain_json(self.fields))
        computed = digest_of(self.fields)
        if self.digest and self.digest != computed:
            raise CorruptRecord(
                f"contract digest {self.digest} does not match its fields ({computed}); the contract file was edited: restore it or start a new search revision"
            )
        object.__setattr__(self, "digest", computed)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def to_json(self) -> dict:
        return {"format": CONTRACT_FORMAT, "digest": self.digest, "contract": dict(self.fields)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Contract:
        if obj.get("format") != CONTRACT_FORMAT:
            raise CorruptRecord(f"contract format {obj.get('format')!r} is not {CONTRACT_FORMAT!r}; this search was made by another parcel_hpc version")
        return cls(fields=obj["contract"], digest=obj["digest"])


def first_difference(frozen: Mapping[str, Any], proposed: Mapping[str, Any]) -> str | None:
    """The first pinned field (in PINNED_ORDER, then by name) whose values differ, else None."""
    keys = list(PINNED_ORDER) + sorted((set(frozen) | set(proposed)) - set(PINNED_ORDER))
    for key in keys:
        if key in frozen or key in proposed:
            if plain_json(frozen.get(key)) != plain_json(proposed.get(key)):
                return key
    return None


def freeze_contract(search_dir: Path, contract: Contract) -> tuple[Contract, bool]:
    """Freeze ``contract`` as the search's contract, or check it against the one already frozen.

    Returns (frozen contract, created). A differing contract raises ``reject:<field>``: a changed
    search needs a new search revision. The file is created exclusively, so two launchers racing on
    a new revision agree on one contract.
    """
    fsio.ensure_dir(search_dir)
    path = search_dir / CONTRACT_FILE
    created = fsio.create_exclusive_json(path, contract.to_json())
    frozen = load_contract(search_dir)
    field_name = first_difference(frozen.fields, contract.fields)
    if field_name is not None:
        raise GovernanceRefusal(
            Outcome.reject(field_name),
            f"{field_name} differs from the contract frozen in {path} ({_where_they_differ(frozen.fields.get(field_name), contract.fields.get(field_name))}); "
            "a changed search needs a new search.revision",
        )
    return frozen, created


def _where_they_differ(frozen: Any, now: Any, at: str = "") -> str:
    """The innermost key whose values differ, in words: ``source_digest: frozen sha256:ab…, now sha256:cd…``."""
    if isinstance(frozen, Mapping) and isinstance(now, Mapping):
        for key in sorted(set(frozen) | set(now), key=str):
            if plain_json(frozen.get(key)) != plain_json(now.get(key)):
                return _where_they_differ(frozen.get(key), now.get(key), f"{at}.{key}" if at else str(key))
    return f"{at + ': ' if at else ''}frozen {_short(frozen)}, now {_short(now)}"


def load_contract(search_dir: Path) -> Contract:
    path = Path(search_dir) / CONTRACT_FILE
    if not path.exists():
        raise UsageError(f"{search_dir} has no {CONTRACT_FILE}; it is not a search directory (point at <search.root>/<search.revision>)")
    return Contract.from_json(fsio.read_json(path))


def plain_json(value: Any) -> Any:
    """JSON round-trip: tuples become lists and key order stops mattering for comparison."""
    return json.loads(fsio.canonical_json(value)) if value is not None else None


def _short(value: Any, limit: int = 60) -> str:
    text = fsio.canonical_json(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."
