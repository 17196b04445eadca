"""The approved baseline a search's winner is compared with: the team's model, checked once at the
launch and pinned in the contract's ``selection.baseline``.

A baseline is one of two kinds. ``TRAINED``: a trainer and parameters of its own
(``selection.baseline.trainer``, by default the search's ``trainer.target``, and
``selection.baseline.params``), trained by the rerun job exactly like a trial; it may be another
model class than the search's. ``ARTIFACT``: a model an earlier release registered
(``selection.baseline.artifact``: its registry entry, or the entry's ``artifact.h5``), loaded with
its trainer and scored through ``serve`` on raw images, never retrained.

``resolve`` (the launch: it imports the trainer and reads the registry entry) turns the config
group into a ``Baseline`` or refuses it in one line; ``Baseline.to_json`` is what the contract pins
and ``Baseline.pinned`` reads it back (pure); ``baseline_trainer`` makes its trainer in a selection
job from the pinned identity. Must not: train or score (``selection.jobs`` does).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.trainer import Trainer, make_trainer, trainer_class, trainer_identity
from parcel_hpc.trainer.params import check_params, declared, with_defaults
from parcel_hpc.trainer.target import observed_identity

WHERE = "selection.baseline.params"
# Hydra merges a dict override into the group's dict (and ~ cannot delete a schema field): point at
# the group that starts empty, whose params are then exactly the user's.
OWN = (
    "an override of selection.baseline.params adds to the group's params; "
    "give your own baseline from the empty group: selection/baseline=given selection.baseline.name=NAME "
    "selection.baseline.trainer=PACKAGE.MODULE:NAME '+selection.baseline.params={...}'"
)
RELEASED_FILES = ("registered.json", "packet.json", "artifact.h5")  # a registry entry, as release.folder.write_entry writes it


class BaselineKind(str, enum.Enum):
    TRAINED = "trained"  # a trainer and params, trained like a trial in the rerun job
    ARTIFACT = "artifact"  # a registered artifact of an earlier release, scored as released


@dataclass(frozen=True)
class ReleasedArtifact:
    """A registry entry of an earlier release, as its files said at the launch."""

    path: str  # the entry's artifact.h5, absolute
    sha256: str  # its digest, checked against registered.json at the launch and pinned
    packet_digest: str  # registered.json's digest of the entry's packet.json
    search_revision: str  # the search that released it
    trial_id: str
    seed: int  # the released trial's seed (build() before load_state)
    released_trainer: Mapping[str, Any]  # the trainer identity its packet records


@dataclass(frozen=True)
class Baseline:
    name: str
    kind: BaselineKind
    trainer: Mapping[str, Any]  # identity (target, unit, source_digest) of the code that trains or loads it
    params: Mapping[str, Any]  # TRAINED: as given; ARTIFACT: the released trial's
    artifact: ReleasedArtifact | None = field(default=None)

    def __post_init__(self) -> None:
        if (self.kind is BaselineKind.ARTIFACT) != (self.artifact is not None):
            raise ValueError(f"a {self.kind.value} baseline {'needs' if self.kind is BaselineKind.ARTIFACT else 'has no'} released artifact")

    @property
    def target(self) -> str:
        return str(self.trainer["target"])

    def describe(self) -> str:
        """One line for the launch, so which model the winner will face is never a surprise at select."""
        if self.artifact is not None:
            art = self.artifact
            return f"approved baseline {self.name}: released {art.search_revision}/{art.trial_id} ({art.sha256[:19]}…), served by {self.target}"
        return f"approved baseline {self.name}: {self.target} trained with {dict(self.params)}"

    def to_json(self, search_trainer: Mapping[str, Any]) -> dict[str, Any]:
        """What the contract pins. A baseline trained with the search's own trainer pins its name and
        params only, as every search did before baselines had a trainer, so those searches continue."""
        out: dict[str, Any] = {"name": self.name, "params": dict(self.params)}
        if self.kind is BaselineKind.ARTIFACT or dict(self.trainer) != dict(search_trainer):
            out["trainer"] = dict(self.trainer)
        if self.artifact is not None:
            out["artifact"] = asdict(self.artifact)
        return out

    @classmethod
    def pinned(cls, m: Mapping[str, Any], search_trainer: Mapping[str, Any]) -> Baseline:
        """The baseline a contract pins (``to_json``'s form); KeyError or TypeError when malformed."""
        trainer = dict(m.get("trainer") or search_trainer)
        if "artifact" in m:
            return cls(str(m["name"]), BaselineKind.ARTIFACT, trainer, dict(m["params"]), ReleasedArtifact(**m["artifact"]))
        return cls(str(m["name"]), BaselineKind.TRAINED, trainer, dict(m["params"]))


def resolve(m: Mapping[str, Any], search_target: str) -> Baseline:
    """The ``selection.baseline`` group checked as the launch must (exit 2, one line): a name; then
    either a trainer that imports and takes exactly the params given, or a registered artifact."""
    name = str(m.get("name") or "").strip()
    if not name:
        raise UsageError("selection.baseline.name is empty; name the approved baseline model")
    trainer, artifact, params = m.get("trainer"), m.get("artifact"), dict(m.get("params") or {})
    if artifact:
        if trainer or params:
            raise UsageError(
                f"selection.baseline gives artifact={artifact} and also {'trainer' if trainer else 'params'}: a released baseline is scored as it was released; "
                "start from the empty group: selection/baseline=given selection.baseline.name=NAME selection.baseline.artifact=PATH"
            )
        return _released(name, str(artifact))
    target = str(trainer or search_target)
    for key, value in params.items():
        if not isinstance(value, (bool, int, float, str)) or (isinstance(value, float) and not math.isfinite(value)):
            raise UsageError(f"{WHERE}.{key}={value!r} is not a value a trial could take; give a finite number, a bool or a string")
    cls = _baseline_class(target)
    try:
        check_params(_declared(cls, target), params, target, WHERE)
    except UsageError as exc:
        stray = sorted(set(params) - set(_declared(cls, target)))
        raise UsageError(f"{exc} ({OWN})" if stray else str(exc)) from None
    return Baseline(name, BaselineKind.TRAINED, trainer_identity(target), params)


def baseline_trainer(baseline: Baseline, search_dir: str | os.PathLike) -> tuple[Trainer, dict[str, Any]]:
    """A fresh trainer of the baseline's class, imported from the search's copy of its code, and the
    params its ``build`` is given (the declared defaults under the baseline's own). The code must be
    the code the contract pinned: another is ``reject:baseline_trainer``, as another trainer is
    ``reject:trainer`` for a trial."""
    identity = observed_identity(baseline.trainer, search_dir)
    if identity != dict(baseline.trainer):
        raise GovernanceRefusal(
            Outcome.reject("baseline_trainer"),
            f"the baseline's trainer {baseline.target} has source {identity['source_digest']}, the contract pins {baseline.trainer.get('source_digest')}; "
            "a changed baseline is a new search revision",
        )
    trainer = make_trainer(baseline.trainer, search_dir)
    return trainer, with_defaults(declared(type(trainer), baseline.target), baseline.params)


def _released(name: str, given: str) -> Baseline:
    path = Path(given).expanduser().absolute()
    entry = path.parent if path.is_file() else path
    where = f"selection.baseline.artifact={given}"
    if not path.exists():
        raise UsageError(f"{where} does not exist; give the registry entry an earlier `parcel-hpc release` printed (registered: <registry>/<revision>/<trial>)")
    missing = [f for f in RELEASED_FILES if not (entry / f).is_file()]
    if missing or (path.is_file() and path.name != "artifact.h5"):
        raise UsageError(
            f"{where} is not a registered release packet ({entry} lacks {', '.join(missing) or 'nothing, but names no artifact.h5'}); "
            "only an artifact `parcel-hpc release` registered can be the approved baseline: give its registry entry"
        )
    record, packet = fsio.read_json(entry / "registered.json"), fsio.read_json(entry / "packet.json")
    sha256 = file_digest(entry / "artifact.h5")
    if sha256 != record.get("artifact_sha256"):
        raise UsageError(f"{where}: artifact.h5 has digest {sha256}, its registry record says {record.get('artifact_sha256')}; restore the released file")
    if digest_of(packet) != record.get("packet_digest"):
        raise UsageError(f"{where}: packet.json is not the packet that was registered (digest {digest_of(packet)}); restore the released file")
    try:
        ran = packet["lineage"]["what_ran"]
        released_trainer, params, seed = dict(ran["trainer"]), dict(ran["params"]), int(ran["seed"])
        revision, trial = str(packet["search"]["revision"]), str(record["trial_id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{where}: its packet lacks {exc}, which a registered packet records; give an entry `parcel-hpc release` registered") from None
    target = str(released_trainer["target"])
    _baseline_class(target)  # the code that loads and serves it must import where the selection jobs run
    artifact = ReleasedArtifact(str(entry / "artifact.h5"), sha256, str(record["packet_digest"]), revision, trial, seed, released_trainer)
    return Baseline(name, BaselineKind.ARTIFACT, trainer_identity(target), params, artifact)


def _baseline_class(target: str) -> type[Trainer]:
    try:
        return trainer_class(target)
    except UsageError as exc:  # its line names trainer.target; here the key is the baseline's
        raise UsageError(str(exc).replace("trainer.target=", "selection.baseline.trainer=", 1)) from None


def _declared(cls: type[Trainer], target: str) -> Mapping[str, Any]:
    try:
        return declared(cls, target)
    except UsageError as exc:
        raise UsageError(str(exc).replace("trainer.target=", "selection.baseline.trainer=", 1)) from None
