"""``parcel-hpc release``: write the packet beside the search, and register the selected artifact
only when the data, reproducibility, performance, parity, slice and final checks passed or were
decided. A registry entry is written whole (files first, ``registered.json`` last, exclusively).

A search with no selection, or one whose selection holds (the hold ``select`` or ``decide``
recorded), is refused with that outcome before anything is written; a selection already
registered is said again and never written twice."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from parcel_hpc import fsio
from parcel_hpc.errors import CorruptRecord, GovernanceRefusal, UsageError
from parcel_hpc.governance.contract import digest_of, sha256_of
from parcel_hpc.governance.outcome import Outcome
from parcel_hpc.ledger import SearchDir
from parcel_hpc.ledger.selection import Released
from parcel_hpc.release import render
from parcel_hpc.release.packet import REGISTERED, build
from parcel_hpc.selection.actions import assess, trial_facts
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.trainer import code

NOT_SELECTED = Outcome.hold("not-selected")


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
    if outcome == REGISTERED:
        code.check_copy(store.search.path, contract["trainer"])  # the code that serves it goes with it
        _writable(registry_root)
    fsio.ensure_dir(store.release_dir)
    for name, text in files.items():
        fsio.atomic_write_text(store.release_dir / name, text)
    if outcome == REGISTERED:
        _register(packet, artifact, files, entry, lambda: code.copy_snapshot(store.search.path, entry, contract["trainer"]))
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


def _register(packet: dict[str, Any], artifact: bytes, files: dict[str, str], entry: Path, copy_code: Callable[[], None]) -> None:
    """The entry's files, the trainer's code that serves the artifact (``serving.load_release``), then
    ``registered.json``, exclusively."""
    marker = entry / "registered.json"
    if marker.exists():
        return  # registered by an earlier release of this selection: a registry entry is never rewritten
    fsio.ensure_dir(entry)
    copy_code()  # whole or not at all, and kept when a retry finds it
    fsio.atomic_write_bytes(entry / "artifact.h5", artifact)
    for name, text in files.items():
        fsio.atomic_write_text(entry / name, text)
    fsio.create_exclusive_json(
        marker, {"artifact_sha256": sha256_of(artifact), "packet_digest": digest_of(packet), "trial_id": packet["selection"]["trial_id"]}
    )
