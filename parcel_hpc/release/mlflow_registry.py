"""The MLflow Model Registry as a release target (``release.registry=mlflow``).

A release that registers adds one version to ``release.model_name``: its artifacts are exactly a
folder-registry entry (``folder.write_entry``: the trainer's code, the artifact, the packet as HTML,
Markdown and JSON, ``registered.json``), uploaded to a run of the ``parcel-releases`` experiment and
read back to check the artifact's sha256 before the version is created. The version's tags carry
the lineage's five answers, each check's verdict and, when a hold was lifted, who lifted it and why;
the alias then moves to it. The version is the commit point: whatever fails before it leaves no
version (the run is marked failed), and a release that finds its selection's version (by the
``parcel.selection_key`` tag) never creates a second one, only finishes what the first left (the
alias). A held or failed release never connects.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.governance.release_target import ReleaseTarget, shown
from parcel_hpc.integrations.mlflow.client import answering, connect
from parcel_hpc.release.folder import Registration

EXPERIMENT = "parcel-releases"
ENTRY = "entry"  # the folder entry's path among the run's artifacts
SELECTION_KEY = "parcel.selection_key"
LINEAGE = ("what_ran", "on_what_data", "how_it_ended", "what_it_cost", "what_was_concluded")


def selection_key(expected: Registration) -> str:
    """One released selection of one search: its versions are found by this tag."""
    return f"{expected.search_id or expected.contract_digest}/selection-{expected.selection}"


def identity_tags(expected: Registration) -> dict[str, str]:
    """What a version must say to be this selection's."""
    return {
        SELECTION_KEY: selection_key(expected),
        "parcel.search_id": expected.search_id,
        "parcel.contract_digest": expected.contract_digest,
        "parcel.selection": str(expected.selection),
        "parcel.trial_id": expected.trial_id,
        "parcel.artifact_sha256": expected.artifact_sha256,
    }


def version_tags(packet: Mapping[str, Any], expected: Registration) -> dict[str, str]:
    """Every tag a version carries (pure): its identity, the lineage's five answers as JSON, each
    check's verdict, rule, numbers and lift, and each decision that lifted a hold (who, why, what)."""
    tags = {
        **identity_tags(expected),
        "parcel.search_revision": str(packet["search"]["revision"]),
        "parcel.packet_digest": digest_of(packet),
        "parcel.outcome": str(packet["outcome"]),
        "parcel.metric_resume": str((packet["lineage"].get("how_it_ended") or {}).get("metric_resume", "")),  # the winner's record's
        **{f"parcel.lineage.{answer}": fsio.canonical_json(packet["lineage"].get(answer)) for answer in LINEAGE},
        **{f"parcel.check.{name}": str(verdict) for name, verdict in packet["checks"].items()},
    }
    for g in packet["gates"]:  # each check's rule with the contract's numbers, what it found, what lifts its hold
        tags.update({f"parcel.check.{g['gate']}.rule": g["rule"], f"parcel.check.{g['gate']}.found": g["found"], f"parcel.check.{g['gate']}.lift": g["lift"]})
    for i, d in enumerate(packet["selection"]["decisions"], 1):
        tags.update({f"parcel.decision.{i}.by": d["by"], f"parcel.decision.{i}.reason": d["reason"], f"parcel.decision.{i}.lifted": d["lifted"]})
    return tags


class MlflowRegistry:
    """One registered model at one tracking server; ``UsageError`` naming the URI when it does not answer."""

    def __init__(self, uri: str, target: ReleaseTarget) -> None:
        self.uri, self.target = uri, target
        self.shown = shown(uri)  # printed and recorded: no credentials
        self.client = connect(uri)

    def location(self, version: str) -> str:
        return f"models:/{self.target.model_name}/{version}"

    def found(self, expected: Registration) -> Any | None:
        """This selection's version, if a release made one (the lowest, should two releases have raced)."""
        query = f"name='{self.target.model_name}' and tags.`{SELECTION_KEY}`='{selection_key(expected)}'"
        with answering(self.uri, "did not answer a search of its registry"):
            versions = list(self.client.search_model_versions(query))
        return min(versions, key=lambda v: int(v.version)) if versions else None

    def problem(self, version: Any, expected: Registration) -> str | None:
        """Why ``version`` is not ``expected``'s registration (None: its tags and its artifact's bytes are)."""
        for key, value in identity_tags(expected).items():
            if version.tags.get(key) != value:
                return f"{self.location(version.version)} names {key}={version.tags.get(key)!r}, this release is {value!r}"
        with tempfile.TemporaryDirectory() as tmp, answering(self.uri, f"could not give back the artifact of {self.location(version.version)}"):
            path = Path(self.client.download_artifacts(version.run_id, f"{ENTRY}/artifact.h5", tmp))
            if file_digest(path) != expected.artifact_sha256:
                return f"the artifact of {self.location(version.version)} is not the one the final evaluation scored ({expected.artifact_sha256})"
        return None

    def refuse(self, problem: str) -> GovernanceRefusal:
        return GovernanceRefusal(
            Outcome.REJECT_REGISTRY_ENTRY,
            f"{problem}; nothing was registered. Ask whoever owns {self.target.model_name} at {self.shown} about that version",
        )

    def checked(self, expected: Registration) -> Any | None:
        """This selection's version if a release made one, and it is this release's (else refused, exit 3)."""
        version = self.found(expected)
        if version is not None and (problem := self.problem(version, expected)) is not None:
            raise self.refuse(problem)
        return version

    def register(self, packet: Mapping[str, Any], expected: Registration, write_entry: Callable[[Path], None], found: Any | None) -> str:
        """This selection's version (``found``: the one ``checked`` found; else created from the
        folder entry ``write_entry`` writes to the directory it is given), the alias moved to it."""
        version = found if found is not None else self._create(packet, expected, write_entry)
        self.point_alias(version.version)
        return self.location(version.version)

    def point_alias(self, version: str) -> None:
        if self.target.alias:
            with answering(self.uri, f"did not move the alias {self.target.alias} to {self.location(version)}", "; the version is registered: release again"):
                self.client.set_registered_model_alias(self.target.model_name, self.target.alias, version)

    def _create(self, packet: Mapping[str, Any], expected: Registration, write_entry: Callable[[Path], None]) -> Any:
        client, name = self.client, self.target.model_name
        after = "; no model version was created: release again"
        with answering(self.uri, "failed before the version was created", after):
            experiment = client.get_experiment_by_name(EXPERIMENT)
            experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(EXPERIMENT)
            run = client.create_run(experiment_id, run_name=f"{packet['search']['revision']} selection {expected.selection}", tags=identity_tags(expected))
        try:
            with tempfile.TemporaryDirectory() as tmp:
                entry = Path(tmp) / ENTRY
                write_entry(entry)
                with answering(self.uri, "did not take the release's files", after):
                    client.log_artifacts(run.info.run_id, str(entry), ENTRY)
                    back = Path(client.download_artifacts(run.info.run_id, f"{ENTRY}/artifact.h5", str(Path(tmp) / "back")))
                if file_digest(back) != expected.artifact_sha256:
                    raise CorruptRecord(f"the artifact uploaded to {self.shown} reads back as {file_digest(back)}, not {expected.artifact_sha256}{after}")
            with answering(self.uri, "failed before the version was created", after):
                if not client.search_registered_models(filter_string=f"name='{name}'"):
                    _create_model(client, name)
                client.create_model_version(
                    name,
                    f"{run.info.artifact_uri}/{ENTRY}",
                    run_id=run.info.run_id,
                    tags=version_tags(packet, expected),
                    description=f"{packet['search']['revision']}, selection {expected.selection}: trial {expected.trial_id} ({packet['outcome']})",
                )
        except BaseException:
            with contextlib.suppress(Exception):  # best effort: the failure that got here is what the user reads
                client.set_terminated(run.info.run_id, "FAILED")
            raise
        with answering(self.uri, "did not close the release's run", "; the version is registered"):
            client.set_terminated(run.info.run_id, "FINISHED")
        version = self.found(expected)  # two releases that raced: the lowest version stays, the other goes
        assert version is not None
        if version.run_id != run.info.run_id:
            with answering(self.uri, "did not remove a second version of this selection"):
                for other in client.search_model_versions(f"name='{name}' and tags.`{SELECTION_KEY}`='{selection_key(expected)}'"):
                    if other.run_id == run.info.run_id:
                        client.delete_model_version(name, other.version)
            if (problem := self.problem(version, expected)) is not None:  # the one that stays must be this selection's too
                raise self.refuse(problem)
        return version


def _create_model(client: Any, name: str) -> None:
    """The registered model, unless a release created it a moment ago."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="parcel-damage classifier releases by parcel_hpc (one version per released selection)")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
