"""Serving a released artifact: a registry entry back to a model that answers raw frames.

A registry entry holds the artifact (the trainer's state, as a checkpoint file), the packet with its
lineage (the trainer's identity, the trial's params and seed, the frames' shape, the preprocessing),
the copy of the trainer's code that trained it and its MLflow model files (``MLmodel``, environment,
example), each listed with its digest in ``registered.json``. ``load_release`` trusts an entry only as
far as the user who owns it: the registry folder around it must be wholly that user's, writable by
nobody else, where nobody else may rename it (``folder.registry_problem``). ``open_entry`` then holds
the entry open (``anchor``: every later read goes through the directory it checked), checks the
artifact and every file the marker lists (``MLmodel`` included), and the code copy whole, and only
then imports the trainer from the entry's own code (never a working tree, never bytecode), builds it
without examples (``trainer.served``: the preprocessing travels in its state, as the selection's
serving-parity check demanded) and loads the released state. No snapshot, no split file: given,
they are checked to be the ones the packet names. Anything else is one line (``UsageError``) before a
line of the entry's code runs; ``mlflow.pyfunc`` loads through ``open_entry`` too (``pyfunc.py``).
Must not: write anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from parcel_hpc import anchor, fsio
from parcel_hpc.checkpoints.format import read as read_checkpoint
from parcel_hpc.data import read_split, snapshot_digest
from parcel_hpc.errors import ParcelError, UsageError, one_line
from parcel_hpc.governance.image import file_digest
from parcel_hpc.release import folder
from parcel_hpc.trainer import Trainer, TrainerState, make_trainer, served, serving_data


def load_release(entry: str | os.PathLike, snapshot: str | os.PathLike | None = None, split: str | os.PathLike | None = None) -> Trainer:
    """The released model of registry ``entry``, ready for ``serve``; ``snapshot`` and ``split``, when
    given: checked to be the files it was trained on (their digests must be the packet's). The registry
    around the entry must be its owner's alone. ``UsageError`` in one line otherwise."""
    named = Path(os.path.abspath(entry))
    problem = folder.registry_problem(named, _found(named).st_uid)
    if problem:
        raise UsageError(f"{named}: {problem}; it is not loaded: whoever could change what the registry holds could have replaced the code it runs")
    return open_entry(named, snapshot, split)


def open_entry(named: Path, snapshot: str | os.PathLike | None = None, split: str | os.PathLike | None = None) -> Trainer:
    """The entry at ``named`` (an absolute path), held open and checked whole, built and given its state."""
    st = _found(named)
    entry = anchor.hold(anchor.Owned(str(named), st.st_uid, st.st_ino, ""))  # every read below: the directory just judged
    if not (entry / folder.MARKER).is_file():
        raise UsageError(f"{named} is not a registry entry (no {folder.MARKER}); give the path `parcel-hpc release` printed after registered:")
    record, packet = fsio.read_json(entry / folder.MARKER), fsio.read_json(entry / "packet.json")
    artifact = entry / folder.ARTIFACT
    if file_digest(artifact) != record["artifact_sha256"]:
        raise UsageError(f"{named}: {folder.ARTIFACT} is not what was registered ({record['artifact_sha256']}); restore the released files")
    ran, seen = packet["lineage"]["what_ran"], packet["lineage"]["on_what_data"]
    problem = folder.files_problem(entry, record, ran["trainer"])
    if problem:
        raise UsageError(f"{named}: {problem}; it is not loaded: restore the released entry")
    if snapshot is not None and snapshot_digest(snapshot) != seen["snapshot_digest"]:
        raise UsageError(f"{snapshot} is not the snapshot {named.name} was trained on ({seen['snapshot_digest']}); give that snapshot, or none")
    if split is not None and read_split(split).digest != seen["split_digest"]:
        raise UsageError(f"{split} is not the split {named.name} was trained on ({seen['split_digest']}); give that split file, or none")
    shape = (packet.get("serving") or {}).get("frame_shape")
    if not shape:
        raise UsageError(f"{named} was registered before entries recorded the frames they serve; load it with the parcel_hpc that released it")
    height, width = (int(n) for n in shape)
    state = read_checkpoint(artifact)
    trainer = make_trainer(ran["trainer"], entry)
    try:
        return served(
            trainer,
            ran["params"],
            int(ran["seed"]),
            TrainerState(state.params, state.extra or {}),
            serving_data((height, width), seen["preprocessing"], seen["split_revision"]),
        )
    except ParcelError:
        raise
    except Exception as exc:  # the selection's serving-parity check built it this way: an entry's trainer that fails here changed since
        raise UsageError(
            f"{named}: its trainer {ran['trainer']['target']}, built without examples and given its state, raised {type(exc).__name__}: {one_line(str(exc))}"
        ) from exc


def _found(named: Path) -> os.stat_result:
    try:
        return os.lstat(named)
    except FileNotFoundError:
        raise UsageError(f"{named} does not exist; give the path `parcel-hpc release` printed after registered:") from None
