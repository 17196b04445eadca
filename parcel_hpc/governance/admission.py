"""Trial identity and admission against the frozen contract, launch side and worker side (pure).

Owns: who a trial is (``TrialIdentity``), the launch's admission of a proposal (``admit``, in the
trial-lineage tutorial's order), the worker's own check of what it opened (``check_worker``), and
the configuration hash that makes equal configurations one trial.

Must not: write anything; the callers journal a refusal (``TrialWriter.admission_refused``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import Contract, digest_of, plain_json
from parcel_hpc.governance.outcome import Outcome

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
                raise UsageError(f"{name}={value!r} is not a digest; pass 'sha256:<hex>' from parcel_hpc.governance.contract")

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


def admit(identity: TrialIdentity, contract: Contract) -> Outcome:
    """``admit`` or the first refusal, in the trial-lineage tutorial's order (pure): a pinned field
    that differs (``ADMISSION_PINNED`` order) gives ``reject:<field>``; only then a missing trial_id
    or image_digest gives ``reject:identity``; then an image other than the contract's."""
    for name in ADMISSION_PINNED:
        if getattr(identity, name) != contract[name]:
            return Outcome.reject(name)
    if not identity.trial_id or not identity.image_digest:
        return Outcome.reject("identity")
    if identity.image_digest != contract["image_digest"]:
        return Outcome.reject("image_digest")
    return Outcome.ADMIT


@dataclass(frozen=True)
class WorkerObservation:
    """What a worker actually opened at start: digests it computed itself, not what it was told."""

    snapshot_digest: str
    split_digest: str
    split_method: str
    image_digest: str
    trainer: Mapping[str, Any]  # trainer_identity() of the code this worker imported


def check_worker(observed: WorkerObservation, contract: Contract) -> Outcome:
    """The worker's own check at start: ``admit`` or ``reject:<field>`` (pure)."""
    if observed.snapshot_digest != contract["snapshot_digest"]:
        return Outcome.reject("snapshot_digest")
    if observed.split_digest != contract["split_digest"] or observed.split_method != contract["split_method"]:
        return Outcome.reject("split_digest")
    if observed.image_digest != contract["image_digest"]:
        return Outcome.reject("image_digest")
    if plain_json(observed.trainer) != plain_json(contract.fields.get("trainer")):
        return Outcome.reject("trainer")
    return Outcome.ADMIT


def drift_detail(outcome: Outcome, observed: WorkerObservation, contract: Contract) -> str:
    """What differs, in words, for a ``check_worker`` refusal (pure)."""
    field = outcome.what
    if field == "trainer":
        pinned = contract.fields.get("trainer") or {}
        key = next((k for k in pinned if observed.trainer.get(k) != pinned[k]), "source_digest")
        found, want = observed.trainer.get(key), pinned.get(key)
        if isinstance(found, Mapping) and isinstance(want, Mapping):  # the distributions: name the first that differs
            name = next((d for d in want if found.get(d) != want[d]), "")
            found, want, key = found.get(name), want.get(name), f"{key} {name}"
        return f"the trainer this worker imported has {key} {str(found)[:40]}, the contract pins {str(want)[:40]}"
    found = {"snapshot_digest": observed.snapshot_digest, "split_digest": observed.split_digest, "image_digest": observed.image_digest}.get(field, "")
    return f"this worker sees {field} {found[:19]}, the contract pins {str(contract[field])[:19]}"


def config_hash(effective: Mapping[str, Any]) -> str:
    """Hash of a trial's effective configuration: equal configurations are one trial."""
    return digest_of(effective)


def admit_proposal(trial_id: str, config_hash: str, contract: Contract) -> Outcome:
    """The launch side's admission of a proposed trial, whichever path proposed it (a fixed list at
    the launch, or a learning sampler's proposal as a slot frees)."""
    return admit(TrialIdentity.for_contract(trial_id, contract, config_hash), contract)
