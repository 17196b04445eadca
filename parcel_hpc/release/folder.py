"""The folder registry, the embedded default: an entry per released selection under
``<search.root>/registry/<revision>/<trial>`` (or ``release --registry DIR``), written whole: the
trainer's code, the artifact, the packet, then ``registered.json``, exclusively. An MLflow version
holds exactly such an entry as its artifacts (``mlflow_registry.py``), so ``serving.load_release``
serves either.

An entry found in the registry is trusted only when it is this one (``entry_problem``): a shared
registry is writable by others, so anything else is ``reject:registry-entry`` before a byte is written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, GovernanceRefusal, UsageError
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.trainer import code

MARKER = "registered.json"


@dataclass(frozen=True)
class Registration:
    """What ``registered.json`` says, and what a found entry must say to be this selection's."""

    contract_digest: str  # the search's contract
    search_id: str  # the search directory's own id (identity.json); "" for a search frozen before ids
    selection: int
    trial_id: str
    artifact_sha256: str  # the artifact the rerun checked and the final evaluation scored


def entry_problem(entry: Path, expected: Registration, trainer: dict[str, Any]) -> str | None:
    """Why the registry entry at ``entry`` is not ``expected``'s (None: it is, byte for byte). Only
    regular files count: a link could point at anything."""
    marker, artifact = entry / MARKER, entry / "artifact.h5"
    if not _regular(marker):
        return f"{marker} is not a regular file"
    try:
        found = fsio.read_json(marker)
    except CorruptRecord as exc:
        return str(exc)
    if not isinstance(found, dict):
        return f"{marker} is not a registration"
    for key, value in asdict(expected).items():
        if found.get(key) != value:
            return f"{marker} names {key}={found.get(key)!r}, this release is {value!r}"
    if not _regular(artifact) or file_digest(artifact) != expected.artifact_sha256:
        return f"{artifact} is not the artifact the final evaluation scored ({expected.artifact_sha256})"
    packet = entry / "packet.json"
    if not _regular(packet) or digest_of(fsio.read_json(packet)) != found.get("packet_digest"):
        return f"{packet} is not the packet {marker} registered"
    if trainer.get("code") and code.copy_digest(entry, trainer) != trainer["source_digest"]:
        return f"the trainer's code in {entry} is not the code the contract pins ({trainer['source_digest']})"
    return None


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def refuse_entry(entry: Path, problem: str) -> GovernanceRefusal:
    return GovernanceRefusal(
        Outcome.REJECT_REGISTRY_ENTRY,
        f"the registry entry {entry} is not this release's: {problem}; nothing was registered. Whoever wrote it, "
        "move it aside (or pass --registry DIR, a registry only you can write) and release again",
    )


def check_writable(root: Path) -> None:
    try:
        fsio.ensure_dir(root)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as exc:
        raise UsageError(f"registry {root} is not writable ({exc.strerror}); pass --registry DIR, a writable shared directory") from None


def check_found(entry: Path, expected: Registration, trainer: dict[str, Any]) -> None:
    """An entry already there must be this selection's (an earlier release that died before it
    journaled); an entry directory without a marker is rewritten, its code copy checked after."""
    if os.path.lexists(entry / MARKER):
        problem = entry_problem(entry, expected, trainer)
        if problem:
            raise refuse_entry(entry, problem)


def write_entry(
    packet: dict[str, Any],
    artifact: bytes,
    files: dict[str, str],
    entry: Path,
    expected: Registration,
    trainer: dict[str, Any],
    copy_code: Callable[[Path], None],
) -> None:
    """The entry's files, the trainer's code that serves the artifact (``serving.load_release``), then
    ``registered.json``, exclusively."""
    marker = entry / MARKER
    if os.path.lexists(marker):
        return  # registered by an earlier release of this selection (``check_found``): never rewritten
    fsio.ensure_dir(entry)
    copy_code(entry)  # whole or not at all, and kept when a retry finds it
    if trainer.get("code") and code.copy_digest(entry, trainer) != trainer["source_digest"]:  # a copy found there is kept: it must be ours
        raise refuse_entry(entry, f"the trainer's code in it is not the code the contract pins ({trainer['source_digest']})")
    fsio.atomic_write_bytes(entry / "artifact.h5", artifact)
    for name, text in files.items():
        fsio.atomic_write_text(entry / name, text)
    if not fsio.create_exclusive_json(marker, {**asdict(expected), "packet_digest": digest_of(packet)}):
        check_found(entry, expected, trainer)  # written by someone else a moment ago
