"""A search's identity on the scheduler: what names its jobs there, and nothing else's.

Two searches of one revision (every researcher who keeps the default ``parcel-search-r1``) share
their revision, their job name and even their contract digest when configured alike. What they
never share is the random id written when a search directory's contract froze. Every job a search
submits carries it: in its name (``<job_name>-<id>``, what squeue and sacct filter on), its
``--comment`` and its ``--wckey``. Pure, except ``SearchDir.ensure_identity`` which writes the file.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.errors import CorruptRecord

IDENTITY_FILE = "identity.json"
IDENTITY_FORMAT = "parcel-search-identity/1"
SHORT = 12  # hex digits of the id in a job name: 48 bits, no collision among a cluster's searches

_ID_RE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class SearchIdentity:
    search_id: str  # 32 hex digits (uuid4), written once per search directory
    contract_digest: str  # the contract it was written for

    def __post_init__(self) -> None:
        if not _ID_RE.fullmatch(self.search_id):
            raise CorruptRecord(f"search id {self.search_id!r} is not 32 hex digits; restore {IDENTITY_FILE} from a backup")

    @classmethod
    def new(cls, contract_digest: str) -> SearchIdentity:
        return cls(uuid.uuid4().hex, contract_digest)

    @property
    def short(self) -> str:
        return self.search_id[:SHORT]

    def job_name(self, base: str) -> str:
        """The scheduler name of a job this search submits under ``base`` (its launcher's job_name)."""
        return f"{base}-{self.short}"

    def comment(self, search_revision: str) -> str:
        return f"parcel-hpc:search={self.search_id}:revision={search_revision}:contract={self.contract_digest}"

    def to_json(self) -> dict[str, Any]:
        return {"format": IDENTITY_FORMAT, "search_id": self.search_id, "contract_digest": self.contract_digest}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SearchIdentity:
        if not isinstance(obj, Mapping) or obj.get("format") != IDENTITY_FORMAT or not {"search_id", "contract_digest"} <= set(obj):
            raise CorruptRecord(f"{IDENTITY_FILE} is not a {IDENTITY_FORMAT} record; restore it from a backup")
        return cls(str(obj["search_id"]), str(obj["contract_digest"]))


def scheduler_name(base: str, identity: SearchIdentity | None) -> str:
    """``base`` with the search's id; a search frozen before identities existed keeps the bare name."""
    return base if identity is None else identity.job_name(base)
