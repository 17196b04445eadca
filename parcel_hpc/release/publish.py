"""``parcel-hpc release``: write the packet beside the search, and register the selected artifact
only when the data, reproducibility, performance, parity, slice and final checks passed or were
decided. A registry entry is written whole (files first, ``registered.json`` last, exclusively).

A search with no selection, or one whose selection holds (the hold ``select`` or ``decide``
recorded), is refused with that outcome before anything is written; a selection already
registered is said again and never written twice. An entry found in the registry is trusted only
when it is this one (``entry_problem``: it names this search, this selection, its trial and the
artifact the final evaluation scored, and its bytes are those): a shared registry is writable by
others, so anything else is ``reject:registry-entry`` before a byte is written."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, GovernanceRefusal, UsageError
from parcel_hpc.governance.contract import Contract, digest_of, sha256_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.ledger.selection import Released
from parcel_hpc.release import render
from parcel_hpc.release.packet import REGISTERED, build
from parcel_hpc.selection.actions import assess, trial_facts
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.trainer import code

NOT_SELECTED = Outcome.hold("not-selected")
MARKER = "registered.json"


@dataclass(frozen=True)
class Registration:
    """What ``registered.json`` says, and what a found entry must say to be this selection's."""

    contract_digest: str  # the search's contract
    search_id: str  # the search directory's own id (identity.json); "" for a search frozen before ids
    selection: int
    trial_id: str
    artifact_sha256: str  # the artifact the rerun checked and the final evaluation scored


def _expected(store: SelectionStore, contract: Contract, n: int) -> Registration | None:
    """This selection's registration; None while it has no final result (nothing to register)."""
    final = store.result(n, JobRole.FINAL)
    if final is None or int(final["selection"]) != n:
        return None
    identity = store.search.identity()
    return Registration(contract.digest, identity.search_id if identity else "", n, str(final["trial_id"]), str(final["winner"]["artifact_sha256"]))


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


def _refuse_entry(entry: Path, problem: str) -> GovernanceRefusal:
    return GovernanceRefusal(
        Outcome.REJECT_REGISTRY_ENTRY,
        f"the registry entry {entry} is not this release's: {problem}; nothing was registered. Whoever wrote it, "
        "move it aside (or pass --registry DIR, a registry only you can write) and release again",
    )


def publish(search_dir: str | os.PathLike, registry: str | os.PathLike | None, *, out: Console, sacct: bool = True) -> dict[str, Any]:
    store = SelectionStore(SearchDir(Path(search_dir)))
    contract = store.search.contract()  # not a search directory: one line, exit 2
    already = _refuse_unreleasable(store)
    if already is not None:
        registered = Path(already.registry_path) / "packet.json"
        if not registered.is_file():
            raise CorruptRecord(
                f"selection {already.selection} was registered at {already.registry_path}, which holds no packet.json now; restore that registry entry"
            )
        expected = _expected(store, contract, already.selection)
        problem = "this selection has no final result" if expected is None else entry_problem(Path(already.registry_path), expected, contract["trainer"])
        if problem:  # the entry changed since this search registered it: never say registered for it
            raise _refuse_entry(Path(already.registry_path), problem)
        out.print(str(REGISTERED), markup=False)
        out.print(f"  already registered: {already.registry_path} (selection {already.selection}); a registry entry is never rewritten", markup=False)
        return fsio.read_json(registered)
    facts = trial_facts(store.search, contract)
    packet = build(store, facts, sacct=sacct)
    outcome = Outcome.parse(packet["outcome"])
    registry_root = Path(os.path.abspath(registry)) if registry else store.search.path.parent / "registry"
    entry = registry_root / packet["search"]["revision"] / packet["selection"]["trial_id"]
    packet["registry_path"] = str(entry) if outcome == REGISTERED else ""
    text_json = fsio.canonical_json(packet)
    files = {
        "packet.json": text_json + "\n",
        "packet.md": render.to_markdown(packet),
        "packet.html": render.to_html(packet, {"curves": {f.record.trial_id: list(f.curve) for f in facts if f.curve}}),
    }
    # The artifact and the registry are checked before anything is written: a packet never says registered in vain.
    artifact = _checked_artifact(packet) if outcome == REGISTERED else b""
    expected = _expected(store, contract, packet["selection"]["number"])
    if outcome == REGISTERED:
        assert expected is not None  # registered: the final check passed, so its result exists
        code.check_copy(store.search.path, contract["trainer"])  # the code that serves it goes with it
        _writable(registry_root)
        _check_found(entry, expected, contract["trainer"])
    fsio.ensure_dir(store.release_dir)
    for name, text in files.items():
        fsio.atomic_write_text(store.release_dir / name, text)
    if outcome == REGISTERED:
        assert expected is not None
        _register(packet, artifact, files, entry, expected, contract["trainer"], lambda: code.copy_snapshot(store.search.path, entry, contract["trainer"]))
    store.writer("release").released(
        Released(packet["selection"]["number"], outcome == REGISTERED, outcome, sha256_of(text_json.encode()), packet["registry_path"])
    )
    out.print(str(outcome), markup=False)
    out.print(f"  packet: {store.release_dir / 'packet.html'} (.json, .md)", markup=False)
    for name, verdict in packet["checks"].items():
        out.print(f"  {name}: {verdict}", markup=False)
    if outcome == REGISTERED:
        out.print(f"  registered: {entry}", markup=False)
    else:
        out.print("  the artifact stays out of the registry until every check passed or was decided", markup=False)
    return packet


def _refuse_unreleasable(store: SelectionStore) -> Released | None:
    """Refuse (exit 3, the outcome first) a search that has no selection or whose selection holds;
    the release that registered the current selection already, if one did."""
    record, n = store.record(), store.current()
    if n is None:
        raise GovernanceRefusal(NOT_SELECTED, f"{store.search.path} has no selection; run `parcel-hpc select`, then `evaluate-final`, then release")
    registered = record.registered(n)
    if registered is not None:
        return registered
    verdict = assess(store, record, n).verdict
    if verdict.outcome.is_refusal:
        raise GovernanceRefusal(
            verdict.outcome,
            f"selection {n} holds ({'; '.join(verdict.reasons)}); nothing is released until `parcel-hpc select` clears it "
            f"(or `parcel-hpc decide` lifts {Outcome.HOLD_SLICE_QUALITY}) and `parcel-hpc evaluate-final` ran",
        )
    return None


def _checked_artifact(packet: dict[str, Any]) -> bytes:
    """Exactly the bytes the rerun checked and the final evaluation scored."""
    checked = packet["final"]["winner"]["artifact_sha256"]
    source = Path(packet["artifact"]["path"])
    data = source.read_bytes() if source.exists() else b""
    if sha256_of(data) != checked:
        raise CorruptRecord(f"the selected artifact {source} is missing or is not the one that was checked ({checked}); restore it before releasing")
    return data


def _writable(root: Path) -> None:
    try:
        fsio.ensure_dir(root)
        with tempfile.TemporaryFile(dir=root):
            pass
    except OSError as exc:
        raise UsageError(f"registry {root} is not writable ({exc.strerror}); pass --registry DIR, a writable shared directory") from None


def _check_found(entry: Path, expected: Registration, trainer: dict[str, Any]) -> None:
    """An entry already there must be this selection's (an earlier release that died before it
    journaled); an entry directory without a marker is rewritten, its code copy checked after."""
    if os.path.lexists(entry / MARKER):
        problem = entry_problem(entry, expected, trainer)
        if problem:
            raise _refuse_entry(entry, problem)


def _register(
    packet: dict[str, Any], artifact: bytes, files: dict[str, str], entry: Path, expected: Registration, trainer: dict[str, Any], copy_code: Callable[[], None]
) -> None:
    """The entry's files, the trainer's code that serves the artifact (``serving.load_release``), then
    ``registered.json``, exclusively."""
    marker = entry / MARKER
    if os.path.lexists(marker):
        return  # registered by an earlier release of this selection (``_check_found``): never rewritten
    fsio.ensure_dir(entry)
    copy_code()  # whole or not at all, and kept when a retry finds it
    if trainer.get("code") and code.copy_digest(entry, trainer) != trainer["source_digest"]:  # a copy found there is kept: it must be ours
        raise _refuse_entry(entry, f"the trainer's code in it is not the code the contract pins ({trainer['source_digest']})")
    fsio.atomic_write_bytes(entry / "artifact.h5", artifact)
    for name, text in files.items():
        fsio.atomic_write_text(entry / name, text)
    if not fsio.create_exclusive_json(marker, {**asdict(expected), "packet_digest": digest_of(packet)}):
        _check_found(entry, expected, trainer)  # written by someone else a moment ago
