"""Where a release registers its artifact (``release.*`` in the config): the folder registry, the
embedded default, or the team's MLflow Model Registry. Pure: the choice, checked, and what of it the
contract pins.

The kind, the registered model's name, the alias and a tracking URI the config gives are pinned (a
search's releases all go to one place); the folder default is left out of the contract, so searches
frozen before this option compare as they did. A server that moved is reached without touching the
contract: a URI given to the command, then ``MLFLOW_TRACKING_URI``, then the pinned one
(``tracking_uri``; ``export --to mlflow`` asks the same way).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import Contract

# MLflow's own rules for an alias: letters, digits, '_' and '-'; "latest" and "v<digits>" are its own.
_ALIAS_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")
_RESERVED_ALIAS_RE = re.compile(r"latest|v\d+", re.IGNORECASE)
_MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,249}")


DEFAULT_MODEL_NAME = "parcel-damage-classifier"
DEFAULT_ALIAS = "champion"


class RegistryKind(str, Enum):
    FOLDER = "folder"  # <search.root>/registry, or release --registry DIR
    MLFLOW = "mlflow"  # the MLflow Model Registry at the tracking URI


@dataclass(frozen=True)
class ReleaseTarget:
    kind: RegistryKind = RegistryKind.FOLDER
    model_name: str = DEFAULT_MODEL_NAME  # the registered model each release adds a version to
    alias: str = DEFAULT_ALIAS  # moved to each version a release registers; "" moves none
    tracking_uri: str | None = None  # None: MLFLOW_TRACKING_URI when release runs

    @classmethod
    def from_config(cls, release: Mapping[str, Any] | None) -> ReleaseTarget:
        """The composed ``release`` node, checked; bad values are one line naming the key (exit 2)."""
        release = release or {}
        kinds = [k.value for k in RegistryKind]
        kind = release.get("registry", RegistryKind.FOLDER.value)
        if kind not in kinds:
            raise UsageError(f"release.registry={kind!r} is not a registry; give one of {', '.join(kinds)}")
        for key in ("model_name", "alias", "tracking_uri"):
            if key in release and not isinstance(release[key], str) and not (key == "tracking_uri" and release[key] is None):
                raise UsageError(f"release.{key}={release[key]!r} is not text; give a quoted name, e.g. release.{key}='my-name'")
        target = cls(
            RegistryKind(kind),
            release.get("model_name", DEFAULT_MODEL_NAME),
            release.get("alias", DEFAULT_ALIAS),
            release.get("tracking_uri") or None,
        )
        if not _MODEL_NAME_RE.fullmatch(target.model_name):
            raise UsageError(f"release.model_name={target.model_name!r} is not a model name; use letters, digits, '.', '_' and '-' (at most 250)")
        if target.alias and (not _ALIAS_RE.fullmatch(target.alias) or _RESERVED_ALIAS_RE.fullmatch(target.alias)):
            raise UsageError(
                f"release.alias={target.alias!r} is not an alias MLflow accepts; use letters, digits, '_' and '-' (not latest or v<number>), or '' for none"
            )
        return target

    def pinned(self) -> dict[str, Any] | None:
        """The contract's ``release`` field; None for the folder default (left out of the contract)."""
        if self.kind is RegistryKind.FOLDER:
            return None
        return {"registry": self.kind.value, "model_name": self.model_name, "alias": self.alias, "tracking_uri": self.tracking_uri}

    @classmethod
    def of(cls, contract: Contract) -> ReleaseTarget:
        """The target a frozen contract pins (the folder registry when it pins none)."""
        return cls.from_config(contract.fields.get("release"))

    def uri(self, environ: Mapping[str, str], given: str | None = None) -> str:
        """The tracking server's URI (``tracking_uri``)."""
        return tracking_uri(given, environ, self.tracking_uri)


def tracking_uri(given: str | None, environ: Mapping[str, str], pinned: str | None) -> str:
    """The URI given to the command, else ``MLFLOW_TRACKING_URI``, else the contract's; one line (exit 2) when none."""
    uri = given or environ.get("MLFLOW_TRACKING_URI") or pinned
    if not uri:
        raise UsageError(
            "no MLflow tracking server: set MLFLOW_TRACKING_URI (e.g. http://mlflow.example:5000), give it to the command "
            "(release --tracking-uri URI, export --to mlflow URI), or launch with release.tracking_uri=URI"
        )
    return uri
