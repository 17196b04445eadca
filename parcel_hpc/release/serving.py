"""Serving a released artifact: a registry entry back to a trainer that answers ``serve(images)``.

A registry entry holds the artifact (the trainer's state, as a checkpoint file), the packet with its
lineage (the trainer's identity, the trial's params and seed, the data's digests) and the copy of the
trainer's code that trained it. ``load_release`` checks the artifact and the packet against the
entry's ``registered.json``, imports the trainer from the entry's own code (never a working tree),
builds it as the selection built it (the interface's ``build`` is given the training data it was
trained on, checked by digest) and loads the released state. Must not: write anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from parcel_hpc import fsio
from parcel_hpc.checkpoints.format import read as read_checkpoint
from parcel_hpc.data import read_split, snapshot_digest
from parcel_hpc.errors import UsageError
from parcel_hpc.governance.contract import digest_of
from parcel_hpc.governance.image import file_digest
from parcel_hpc.trainer import Trainer, TrainerState, build_params, load_training_data, make_trainer


def load_release(entry: str | os.PathLike, snapshot: str | os.PathLike, split: str | os.PathLike) -> Trainer:
    """The released model of registry ``entry``, ready for ``serve``; ``snapshot`` and ``split``: the
    files it was trained on (their digests must be the packet's). ``UsageError`` in one line otherwise."""
    entry = Path(entry)
    if not (entry / "registered.json").is_file():
        raise UsageError(f"{entry} is not a registry entry (no registered.json); give the path `parcel-hpc release` printed after registered:")
    record, packet = fsio.read_json(entry / "registered.json"), fsio.read_json(entry / "packet.json")
    artifact = entry / "artifact.h5"
    if file_digest(artifact) != record["artifact_sha256"] or digest_of(packet) != record["packet_digest"]:
        raise UsageError(f"{entry}: artifact.h5 or packet.json is not what was registered ({record['artifact_sha256']}); restore the released files")
    ran, seen = packet["lineage"]["what_ran"], packet["lineage"]["on_what_data"]
    if snapshot_digest(snapshot) != seen["snapshot_digest"]:
        raise UsageError(f"{snapshot} is not the snapshot {entry.name} was trained on ({seen['snapshot_digest']}); give that snapshot")
    parsed = read_split(split)
    if parsed.digest != seen["split_digest"]:
        raise UsageError(f"{split} is not the split {entry.name} was trained on ({seen['split_digest']}); give that split file")
    data = load_training_data(snapshot, parsed, seen["preprocessing"], verify_digest=False)  # hashed just above
    trainer = make_trainer(ran["trainer"], entry)
    trainer.build(build_params(trainer, ran["params"]), int(ran["seed"]), data)
    state = read_checkpoint(artifact)
    trainer.load_state(TrainerState(state.params, state.extra or {}))
    return trainer
