"""``parcel-hpc release``: write the packet beside the search, and register the selected artifact
only when the data, reproducibility, performance, parity, slice and final checks passed or were
decided, in the registry the contract pins (``governance.release_target``): the folder registry
(``folder.py``) or MLflow's (``mlflow_registry.py``).

A search with no selection, or one whose selection holds (the hold ``select`` or ``decide``
recorded), is refused with that outcome before anything is written; a selection already
registered is said again and never written twice. What a registry holds for this selection is
trusted only when it is this one (it names this search, this selection, its trial and the artifact
the final evaluation scored, and its bytes are those): a shared registry is writable by others, so
anything else is ``reject:registry-entry`` before a byte is written. A registry that cannot be
written or does not answer is one line (exit 2), before anything is written."""

from __future__ import annotations

import importlib.metadata
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from parcel_hpc import anchor, fsio
from parcel_hpc.errors import CorruptRecord, UsageError
from parcel_hpc.governance.contract import Contract, sha256_of
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.governance.release_target import RegistryKind, ReleaseTarget, shown
from parcel_hpc.integrations.mlflow import model
from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.ledger.selection import Released
from parcel_hpc.release import folder, render
from parcel_hpc.release.folder import Registration
from parcel_hpc.release.mlflow_registry import MlflowRegistry
from parcel_hpc.release.packet import REGISTERED, build
from parcel_hpc.selection.actions import assess, trial_facts
from parcel_hpc.selection.gates import Judgement, first_hold
from parcel_hpc.selection.store import SelectionStore
from parcel_hpc.trainer import code

NOT_SELECTED = Outcome.hold("not-selected")


def publish(
    search_dir: str | os.PathLike,
    registry: str | os.PathLike | None,
    *,
    out: Console,
    sacct: bool = True,
    environ: Mapping[str, str] = os.environ,
    tracking_uri: str | None = None,
) -> dict[str, Any]:
    """``registry``: the folder registry's root (``--registry DIR``); ``tracking_uri``: an MLflow
    server given to the command (``--tracking-uri``), before ``MLFLOW_TRACKING_URI`` and the contract's."""
    store = SelectionStore(SearchDir(Path(search_dir)))
    contract = store.search.contract()  # not a search directory: one line, exit 2
    owned = anchor.identify(store.search.path)  # checked again before anything is written
    target = ReleaseTarget.of(contract)
    if target.kind is RegistryKind.MLFLOW and registry is not None:
        raise UsageError("--registry DIR is the folder registry's; this search registers in MLflow (its contract pins release.registry=mlflow): leave it out")
    already = _refuse_unreleasable(store)
    if already is not None:
        return _said_again(store, contract, target, already, out, environ, tracking_uri)
    facts = trial_facts(store.search, contract)
    packet = build(store, facts, sacct=sacct)
    outcome = Outcome.parse(packet["outcome"])
    registered = outcome == REGISTERED
    # Where it goes, and for MLflow a server that answers, before anything is written.
    mlflow: MlflowRegistry | None = None
    if target.kind is RegistryKind.FOLDER:
        registry_root = Path(os.path.abspath(registry)) if registry else store.search.path.parent / "registry"
        entry = registry_root / packet["search"]["revision"] / packet["selection"]["trial_id"]
        packet["registry_path"] = str(entry) if registered else ""
    else:
        uri = target.uri(environ, tracking_uri) if registered else (target.tracking_uri or "")
        packet["registry"] = {"kind": target.kind.value, "tracking_uri": shown(uri), "model_name": target.model_name, "alias": target.alias}
        packet["registry_path"] = f"models:/{target.model_name}" if registered else ""  # the version: the ledger's Released
    text_json = fsio.canonical_json(packet)
    files = {
        "packet.json": text_json + "\n",
        "packet.md": render.to_markdown(packet),
        "packet.html": render.to_html(packet, {"curves": {f.record.trial_id: list(f.curve) for f in facts if f.curve}}),
    }
    # The artifact and the registry are checked before anything is written: a packet never says registered in vain.
    artifact = _checked_artifact(packet) if registered else b""
    entry_files = files | _model_files(packet) if registered else files  # the entry is an MLflow model (release.pyfunc)
    expected = _expected(store, contract, packet["selection"]["number"])
    found = None
    if registered:
        assert expected is not None  # registered: the final check passed, so its result exists
        code.check_copy(store.search.path, contract["trainer"])  # the code that serves it goes with it
        if target.kind is RegistryKind.FOLDER:
            folder.check_own_registry(entry)  # a registry someone else planted, opened or can swap: refused before it is created
            folder.check_writable(registry_root)
            folder.check_found(entry, expected, contract["trainer"])
        else:
            mlflow = MlflowRegistry(uri, target)
            found = mlflow.checked(expected)

    def write_entry(destination: Path) -> None:
        """The registry entry (code, artifact, packet, marker) in ``destination``: the folder's, or what an MLflow version holds."""
        assert expected is not None  # registered: the final check passed, so its result exists
        folder.write_entry(
            packet, artifact, entry_files, destination, expected, contract["trainer"], lambda to: code.copy_snapshot(store.search.path, to, contract["trainer"])
        )

    location = packet["registry_path"]
    anchor.check(owned)  # still the search this release read: nothing is written for another
    if mlflow is not None:  # the version is the commit point: the packet is written once it exists
        assert expected is not None
        location = mlflow.register(packet, expected, write_entry, found)
    fsio.ensure_dir(store.release_dir)
    for name, text in files.items():
        fsio.atomic_write_text(store.release_dir / name, text)
    if registered and mlflow is None:
        write_entry(entry)
    store.writer("release").released(Released(packet["selection"]["number"], registered, outcome, sha256_of(text_json.encode()), location))
    out.print(str(outcome), markup=False)
    holding = first_hold(tuple(Judgement.from_json(g) for g in packet["gates"]))
    for line in holding.lines() if holding is not None else ():
        out.print(f"  {line}", markup=False, soft_wrap=True)  # never folded: a rule is read whole
    out.print(f"  packet: {store.release_dir / 'packet.html'} (.json, .md)", markup=False)
    for g in packet["gates"]:
        out.print(f"  {g['gate']}: {g['check']}" + (f" ({g['found']})" if g["found"] else ""), markup=False, soft_wrap=True)
    if not registered:
        out.print("  the artifact stays out of the registry until every check passed or was decided", markup=False)
    elif mlflow is None:
        out.print(f"  registered: {location}", markup=False)
    else:
        out.print(f"  registered: {location} at {mlflow.shown}" + (f" (alias {target.alias})" if target.alias else ""), markup=False)
    return packet


def _said_again(
    store: SelectionStore, contract: Contract, target: ReleaseTarget, already: Released, out: Console, environ: Mapping[str, str], tracking_uri: str | None
) -> dict[str, Any]:
    """A selection registered already: checked to be still this release's, said again, never written twice."""
    expected = _expected(store, contract, already.selection)
    released = store.release_dir / "packet.json"
    if target.kind is RegistryKind.MLFLOW:
        mlflow = MlflowRegistry(target.uri(environ, tracking_uri), target)
        version = mlflow.found(expected) if expected is not None else None
        if expected is None or version is None or mlflow.location(version.version) != already.registry_path:
            raise mlflow.refuse(f"{already.registry_path}: {'this selection has no final result' if expected is None else 'it is not there now'}")
        if (problem := mlflow.problem(version, expected)) is not None:
            raise mlflow.refuse(problem)
        where = f"{already.registry_path} at {mlflow.shown}"  # the alias is left where it is: another release may have moved it since
    else:
        registered = Path(already.registry_path) / "packet.json"
        if not registered.is_file():
            raise CorruptRecord(
                f"selection {already.selection} was registered at {already.registry_path}, which holds no packet.json now; restore that registry entry"
            )
        entry = Path(already.registry_path)
        problem = (
            "this selection has no final result"
            if expected is None
            else folder.registry_problem(entry, os.getuid()) or folder.entry_problem(entry, expected, contract["trainer"])
        )
        if problem:  # the entry changed since this search registered it: never say registered for it
            raise folder.refuse_entry(entry, problem)
        released, where = registered, already.registry_path
    out.print(str(REGISTERED), markup=False)
    out.print(f"  already registered: {where} (selection {already.selection}); a registry entry is never rewritten", markup=False)
    return fsio.read_json(released)


def _expected(store: SelectionStore, contract: Contract, n: int) -> Registration | None:
    """This selection's registration; None while it has no final result (nothing to register)."""
    final = store.result(n, JobRole.FINAL)
    if final is None or int(final["selection"]) != n:
        return None
    identity = store.search.identity()
    return Registration(contract.digest, identity.search_id if identity else "", n, str(final["trial_id"]), str(final["winner"]["artifact_sha256"]))


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
            f"selection {n} holds ({'; '.join(verdict.reasons)}); nothing is released until the hold is lifted and `parcel-hpc evaluate-final` ran",
        )
    return None


def _checked_artifact(packet: dict[str, Any]) -> bytes:
    """Exactly the bytes the rerun checked and the final evaluation scored."""
    return _recorded_bytes(Path(packet["artifact"]["path"]), packet["final"]["winner"]["artifact_sha256"], "the selected artifact", "the one that was checked")


def _recorded_bytes(source: Path, sha256: str, what: str, which: str) -> bytes:
    """The file ``source`` holds, when its sha256 is the one its record names; ``CorruptRecord`` otherwise."""
    data = source.read_bytes() if source.is_file() else b""
    if sha256_of(data) != sha256:
        raise CorruptRecord(f"{what} {source} is missing or is not {which} ({sha256}); restore it before releasing")
    return data


def _model_files(packet: dict[str, Any]) -> dict[str, str]:
    """The entry's MLflow model files: its signature from the frames the rerun served, its environment
    from the contract's pins (and the parcel_hpc the rerun ran), its input example the validation
    frames the rerun kept (checked to be the bytes it recorded)."""
    serving = packet.get("serving") or {}
    example = serving.get("example")
    if not example or not serving.get("frame_shape"):
        raise UsageError(
            f"selection {packet['selection']['number']}'s rerun recorded no serving example (it ran before a registered model was an MLflow model); "
            "release it with the parcel_hpc that selected it, or select a new search revision"
        )
    data = _recorded_bytes(Path(example["path"]), example["sha256"], "the serving example", "the one the rerun recorded")
    ran = packet["lineage"]["what_ran"]
    version = ran["dependencies"]["key"].get("parcel-hpc") or importlib.metadata.version("parcel-hpc")
    frames = np.load(io.BytesIO(data), allow_pickle=False)
    return model.model_files(serving["frame_shape"], frames, model.requirements(ran["trainer"], version))
