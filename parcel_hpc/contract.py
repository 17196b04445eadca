"""The frozen search contract, digests, trial identity and admission.

Owns: the canonical form of a search contract, its digest, freezing it once per search revision,
and the per-trial admission decision. Everything here is pure except ``freeze_contract``, which
touches exactly one file (``<search_dir>/contract.json``, created exclusively, never rewritten).

Must not: read Hydra objects (callers pass plain dicts), open data files, or dispatch anything.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import fsio
from .errors import CorruptRecord, GovernanceRefusal, UsageError

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
            raise GovernanceRefusal("reject:identity", f"contract lacks {', '.join(missing)}")
        object.__setattr__(self, "fields", _plain(self.fields))
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
            if _plain(frozen.get(key)) != _plain(proposed.get(key)):
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
            f"reject:{field_name}",
            f"{field_name} differs from the contract frozen in {path} "
            f"(frozen {_short(frozen.fields.get(field_name))}, now {_short(contract.fields.get(field_name))}); "
            "a changed search needs a new search.revision",
        )
    return frozen, created


def load_contract(search_dir: Path) -> Contract:
    path = Path(search_dir) / CONTRACT_FILE
    if not path.exists():
        raise UsageError(f"{search_dir} has no {CONTRACT_FILE}; it is not a search directory (point at <search.root>/<search.revision>)")
    return Contract.from_json(fsio.read_json(path))


# --- trial identity and admission -------------------------------------------------------------

ADMIT = "admit"
# The trial-lineage tutorial's order: the pinned fields first, then identity, then the image.
ADMISSION_PINNED = ("snapshot_digest", "split_digest", "metric_revision", "search_revision")


_TRIAL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def check_trial_id(trial_id: object) -> str:
    """A trial id names files and folders (and, dot-free, never looks like a marker's suffix)."""
    if not isinstance(trial_id, str) or not _TRIAL_ID.fullmatch(trial_id):
        raise UsageError(f"trial id {trial_id!r} is not usable as a file name; use letters, digits, '_' and '-' (at most 128)")
    return trial_id


@dataclass(frozen=True)
class TrialIdentity:
    """Who a trial is and what it says it runs against.

    Admission compares the pinned fields with the frozen contract; claims and checkpoints compare
    ``CLAIM_FIELDS`` with the holder's. Empty fields may exist (admission answers ``reject:identity``);
    a field that is set must be well-formed.
    """

    trial_id: str
    config_hash: str  # "sha256:..." of the canonical effective config
    contract_digest: str  # "sha256:..." of the frozen search contract
    snapshot_digest: str
    split_digest: str = ""
    metric_revision: str = ""
    search_revision: str = ""
    image_digest: str = ""

    CLAIM_FIELDS = ("trial_id", "config_hash", "contract_digest", "snapshot_digest")

    def __post_init__(self) -> None:
        if self.trial_id:
            check_trial_id(self.trial_id)
        for name in ("config_hash", "contract_digest"):
            value = getattr(self, name)
            if value and not (isinstance(value, str) and value.startswith("sha256:") and len(value) > 7):
                raise UsageError(f"{name}={value!r} is not a digest; pass 'sha256:<hex>' from parcel_hpc.contract")

    @classmethod
    def for_contract(cls, trial_id: str, contract: Contract, config_hash: str = "") -> TrialIdentity:
        return cls(
            trial_id=trial_id,
            config_hash=config_hash,
            contract_digest=contract.digest,
            snapshot_digest=contract["snapshot_digest"],
            split_digest=contract["split_digest"],
            metric_revision=contract["metric_revision"],
            search_revision=contract["search_revision"],
            image_digest=contract["image_digest"],
        )

    def mismatch(self, other: TrialIdentity) -> str | None:
        """The first claim field that differs, or None when both name the same trial."""
        return next((name for name in self.CLAIM_FIELDS if getattr(self, name) != getattr(other, name)), None)

    def claim_json(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in self.CLAIM_FIELDS}

    @classmethod
    def from_claim_json(cls, obj: Mapping[str, Any]) -> TrialIdentity:
        return cls(*(obj[name] for name in cls.CLAIM_FIELDS))


def admit(identity: TrialIdentity, contract: Contract) -> str:
    """``admit`` or the first refusal, in the trial-lineage tutorial's order (pure): a pinned field
    that differs (``ADMISSION_PINNED`` order) gives ``reject:<field>``; only then a missing trial_id
    or image_digest gives ``reject:identity``; then an image other than the contract's."""
    for name in ADMISSION_PINNED:
        if getattr(identity, name) != contract[name]:
            return f"reject:{name}"
    if not identity.trial_id or not identity.image_digest:
        return "reject:identity"
    if identity.image_digest != contract["image_digest"]:
        return "reject:image_digest"
    return ADMIT


@dataclass(frozen=True)
class WorkerObservation:
    """What a worker actually opened at start: digests it computed itself, not what it was told."""

    snapshot_digest: str
    split_digest: str
    split_method: str
    image_digest: str
    trainer: Mapping[str, Any]  # trainer_identity() of the code this worker imported


def check_worker(observed: WorkerObservation, contract: Contract) -> str:
    """The worker's own check at start: ``admit`` or ``reject:<field>`` (pure)."""
    if observed.snapshot_digest != contract["snapshot_digest"]:
        return "reject:snapshot_digest"
    if observed.split_digest != contract["split_digest"] or observed.split_method != contract["split_method"]:
        return "reject:split_digest"
    if observed.image_digest != contract["image_digest"]:
        return "reject:image_digest"
    if _plain(observed.trainer) != _plain(contract.fields.get("trainer")):
        return "reject:trainer"
    return ADMIT


def config_hash(effective: Mapping[str, Any]) -> str:
    """Hash of a trial's effective configuration: equal configurations are one trial."""
    return digest_of(effective)


def _plain(value: Any) -> Any:
    """JSON round-trip: tuples become lists and key order stops mattering for comparison."""
    return json.loads(fsio.canonical_json(value)) if value is not None else None


def _short(value: Any, limit: int = 60) -> str:
    text = fsio.canonical_json(value) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."
