"""Serving a released artifact: a registry entry back to a trainer that answers ``serve(images)``.

A registry entry holds the artifact (the trainer's state, as a checkpoint file), the packet with its
lineage (the trainer's identity, the trial's params and seed, the data's digests) and the copy of the
trainer's code that trained it. ``load_release`` trusts an entry only as far as the user who owns
it: the registry folder around it must be wholly that user's, writable by nobody else, where nobody
else may rename it (``folder.registry_problem``). It then holds the entry open (``anchor``: every
later read goes through the directory it checked), checks the artifact, the packet and the code copy,
whole, against the entry's ``registered.json``, and only then imports the trainer from the entry's
own code (never a working tree, never bytecode), builds it as the selection built it (the
interface's ``build`` is given the training data it was trained on, checked by digest) and loads the
released state. Anything else is one line (``UsageError``) before a line of the entry's code runs.
Must not: write anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from parcel_hpc import anchor, fsio
from parcel_hpc.checkpoints.format import read as read_checkpoint
from parcel_hpc.data import read_split, snapshot_digest
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.image import file_digest
from parcel_hpc.release import folder
from parcel_hpc.trainer import Trainer, TrainerState, build_params, load_training_data, make_trainer


def load_release(entry: str | os.PathLike, snapshot: str | os.PathLike, split: str | os.PathLike) -> Trainer:
    """The released model of registry ``entry``, ready for ``serve``; ``snapshot`` and ``split``: the
    files it was trained on (their digests must be the packet's). ``UsageError`` in one line otherwise."""
    named = Path(os.path.abspath(entry))
    try:
        st = os.lstat(named)
    except FileNotFoundError:
        raise UsageError(f"{named} does not exist; give the path `parcel-hpc release` printed after registered:") from None
    problem = folder.registry_problem(named, st.st_uid)
    if problem:
        raise UsageError(f"{named}: {problem}; it is not loaded: whoever could change what the registry holds could have replaced the code it runs")
    entry = anchor.hold(anchor.Owned(str(named), st.st_uid, st.st_ino, ""))  # every read below: the directory just judged
    if not (entry / folder.MARKER).is_file():
        raise UsageError(f"{named} is not a registry entry (no {folder.MARKER}); give the path `parcel-hpc release` printed after registered:")
    record, packet = fsio.read_json(entry / folder.MARKER), fsio.read_json(entry / "packet.json")
    artifact = entry / "artifact.h5"
    if file_digest(artifact) != record["artifact_sha256"]:
        raise UsageError(f"{named}: artifact.h5 is not what was registered ({record['artifact_sha256']}); restore the released files")
    ran, seen = packet["lineage"]["what_ran"], packet["lineage"]["on_what_data"]
    problem = folder.files_problem(entry, record, ran["trainer"])
    if problem:
        raise UsageError(f"{named}: {problem}; it is not loaded: restore the released entry")
    if snapshot_digest(snapshot) != seen["snapshot_digest"]:
        raise UsageError(f"{snapshot} is not the snapshot {named.name} was trained on ({seen['snapshot_digest']}); give that snapshot")
    parsed = read_split(split)
    if parsed.digest != seen["split_digest"]:
        raise UsageError(f"{split} is not the split {named.name} was trained on ({seen['split_digest']}); give that split file")
    data = load_training_data(snapshot, parsed, seen["preprocessing"], verify_digest=False)  # hashed just above
    trainer = make_trainer(ran["trainer"], entry)
    trainer.build(build_params(trainer, ran["params"]), int(ran["seed"]), data)
    state = read_checkpoint(artifact)
    trainer.load_state(TrainerState(state.params, state.extra or {}))
    return trainer
