"""The folder registry, the embedded default: an entry per released selection under
``<search.root>/registry/<revision>/<trial>`` (or ``release --registry DIR``), written whole: the
trainer's code, the artifact, the packet, the MLflow model's files (``MLmodel`` with its pyfunc
flavor, its environment and input example: ``release.pyfunc``), then ``registered.json``,
exclusively, listing every file with its digest. The entry is an MLflow model directory, and an
MLflow version holds exactly such an entry as its artifacts (``mlflow_registry.py``), so
``serving.load_release`` and ``mlflow.pyfunc.load_model`` serve either.

An entry found in the registry is trusted only when it is this one (``entry_problem``), its code
copy whole included (``code.copy_problem``: a ``.pyc`` added to it is a changed entry): anything else
is ``reject:registry-entry`` before a byte is written. And a registry folder follows the rule a
search directory does (``registry_problem``): it, its revision folders and its entries are one
user's alone, writable by nobody else, in a folder nobody else may rename it out of. ``release``
writes only into a registry of its own user's, and ``serving.load_release`` loads only from a
registry wholly its entry's owner's: a registry folder someone planted, opened to a group or put
where others can swap it would let them replace what an admin later loads and runs.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parcel_hpc import anchor, fsio, ownership
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.contract import digest_of, sha256_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.trainer import code

MARKER = "registered.json"
ARTIFACT = "artifact.h5"
DOWNLOAD_NOTE = "registered_model_meta"  # what `mlflow artifacts download models:/...` adds to the entry it gives (name and version; never read here)


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
    marker, artifact = entry / MARKER, entry / ARTIFACT
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
    return files_problem(entry, found, trainer) or None


def files_problem(entry: Path, registered: dict[str, Any], trainer: dict[str, Any]) -> str:
    """Why the entry's files are not what its marker ``registered`` (and the packet's ``trainer``) pin:
    "" when they are. Each file the release wrote has its digest (the MLflow model's ``MLmodel`` and
    environment files included: ``MLmodel`` names the module a loader imports), nothing else lies at the
    entry's top but the artifact, the code copy and MLflow's own download note, and the code copy is
    whole (nothing added to it, bytecode included). An entry registered before its marker listed its
    files has its packet checked alone."""
    packet, shown = entry / "packet.json", anchor.shown(entry)  # named as others know it, not through a held descriptor
    if not _regular(packet) or digest_of(fsio.read_json(packet)) != registered.get("packet_digest"):
        return f"{shown}/packet.json is not the packet {MARKER} registered"
    listed = registered.get("files")
    if listed is not None:
        for name, digest in sorted(dict(listed).items()):
            if not _regular(entry / name) or file_digest(entry / name) != digest:
                return f"{shown}/{name} is not the file {MARKER} registered"
        known = {MARKER, ARTIFACT, code.CODE_DIR, DOWNLOAD_NOTE, *listed}
        extra = sorted(set(os.listdir(entry)) - known)
        if extra:
            return f"{shown} holds {extra[0]}, which {MARKER} does not list"
    if trainer.get("code"):
        return code.copy_problem(code.snapshot_dir(entry, str(trainer["source_digest"])), str(trainer["source_digest"]))
    return ""


def registry_problem(entry: Path, uid: int) -> str:
    """Why someone other than ``uid`` could have put (or could replace) what the registry entry
    ``entry`` holds: the entry or anything in it, its revision folder or its registry folder (the two
    above it: whoever may write or owns them may swap the entry) owned by another user or writable by
    its group or others, or the registry folder where others may rename it away (a folder above it
    writable without the sticky bit); "" when none. What does not exist yet is the releaser's to create."""
    registry = entry.parent.parent
    for top, below in ((registry, False), (entry.parent, False), (entry, True)):
        if not os.path.lexists(top):
            continue
        found = ownership.trespass(top, uid) if below else _judged(top, uid)
        if found is not None:
            return found.said(uid)
    renamable = ownership.open_to_renames(registry.parent)
    if renamable is not None:
        folder, mode = renamable
        return f"{folder} is writable by its group or others without the sticky bit (mode {mode:04o}): they could rename the registry away and put theirs in its place"
    return ""


def _judged(folder: Path, uid: int) -> ownership.Trespass | None:
    """``folder`` itself (not what it holds) when another user than ``uid`` owns it or others may write it."""
    st = os.stat(folder)  # a registry named through a link is the folder it names (the link's own folder is judged above it)
    mode = stat.S_IMODE(st.st_mode)
    return ownership.Trespass(folder, st.st_uid, mode) if st.st_uid != uid or mode & ownership.OTHERS_WRITE else None


def check_own_registry(entry: Path) -> None:
    """Refuse (exit 2, one line, nothing written) a registry this user's release may not trust to stay its own."""
    problem = registry_problem(entry, os.getuid())
    if problem:
        raise UsageError(
            f"registry {entry.parent.parent}: {problem}; nothing was registered: pass --registry DIR, a folder of yours that others can "
            "neither write nor rename (or have the root made 3775 and the registry folder yours)"
        )


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
    """The entry's ``files`` (the packet, the MLflow model's ``MLmodel``, environment and example), the
    trainer's code that serves the artifact (``serving.load_release``), then ``registered.json``, exclusively,
    listing every file with its digest."""
    marker = entry / MARKER
    if os.path.lexists(marker):
        return  # registered by an earlier release of this selection (``check_found``): never rewritten
    fsio.ensure_dir(entry)
    copy_code(entry)  # whole or not at all, and kept when a retry finds it
    if trainer.get("code") and (why := code.copy_problem(code.snapshot_dir(entry, str(trainer["source_digest"])), str(trainer["source_digest"]))):
        raise refuse_entry(entry, why)  # a copy found there is kept: it must be ours, whole
    fsio.atomic_write_bytes(entry / ARTIFACT, artifact)
    for name, text in files.items():
        fsio.atomic_write_text(entry / name, text)
    listed = {name: sha256_of(text.encode("utf-8")) for name, text in files.items()}
    if not fsio.create_exclusive_json(marker, {**asdict(expected), "packet_digest": digest_of(packet), "files": listed}):
        check_found(entry, expected, trainer)  # written by someone else a moment ago
