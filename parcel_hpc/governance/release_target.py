"""Where a release registers its artifact (``release.*`` in the config): the folder registry, the
embedded default, or the team's MLflow Model Registry. Pure: the choice, checked, and what of it the
contract pins.

The kind, the registered model's name, the alias and a tracking URI the config gives are pinned (a
search's releases all go to one place); the folder default is left out of the contract, so searches
frozen before this option compare as they did. A server that moved is reached without touching the
contract: a URI given to the command, then ``MLFLOW_TRACKING_URI``, then the pinned one
(``tracking_uri``; ``export --to mlflow`` asks the same way).

Credentials never enter a record or a printed line. The server's user, password or token come from
where MLflow reads them (``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD``,
``MLFLOW_TRACKING_TOKEN``, or ``~/.netrc``); a URI that carries them (``http://user:pw@host``, a query
parameter named like a token) is refused at the launch, which would pin it in the world-readable
contract, and shown without them wherever a URI given to a command is printed or recorded (``shown``).
"""

from __future__ import annotations

import re
import urllib.parse
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


# A query parameter whose name says it carries a secret (?token=, ?api_key=, ?X-Amz-Signature=, ?sig=).
_SECRET_PARAM_RE = re.compile(r"token|secret|passw|pwd|key|auth|credential|signature|^sig$|session", re.IGNORECASE)
HIDDEN = "***"

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
        """The contract's ``release`` field; None for the folder default (left out of the contract).
        A tracking URI with credentials in it is refused: the contract is world-readable."""
        if self.kind is RegistryKind.FOLDER:
            return None
        found = credentials(self.tracking_uri or "")
        if found:
            raise UsageError(
                f"release.tracking_uri={shown(self.tracking_uri or '')} carries {' and '.join(found)}, which the contract would pin for anyone who "
                "can read the search; give the URI without them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                "(or MLFLOW_TRACKING_TOKEN, or a ~/.netrc entry for the host) where release runs"
            )
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


def credentials(uri: str) -> list[str]:
    """What in ``uri`` is a credential, in words ([] when nothing): a user and password, a query
    parameter named like a token (pure)."""
    parts = urllib.parse.urlsplit(uri)
    found = []
    if parts.password is not None:
        found.append("a password")
    elif parts.username is not None:
        found.append("a user name")
    found += [f"the query parameter {name}" for name, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if _SECRET_PARAM_RE.search(name)]
    return found


def shown(uri: str) -> str:
    """``uri`` as it may be printed and recorded: no user or password, a token-like query value
    replaced by ``***`` (pure)."""
    parts = urllib.parse.urlsplit(uri)
    if not credentials(uri):
        return uri
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    query = [(name, HIDDEN if _SECRET_PARAM_RE.search(name) else value) for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=urllib.parse.urlencode(query, safe="*")))


def scrubbed(text: str, uri: str) -> str:
    """``text`` (a server's error, say) with every secret of ``uri`` in it replaced by ``***`` (pure)."""
    parts = urllib.parse.urlsplit(uri)
    secrets = [parts.password or "", *(value for name, value in urllib.parse.parse_qsl(parts.query) if _SECRET_PARAM_RE.search(name))]
    text = text.replace(uri, shown(uri))
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, HIDDEN).replace(urllib.parse.quote(secret, safe=""), HIDDEN)
    return text
