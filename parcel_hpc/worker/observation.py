"""What a process about to train or score actually has in hand: digests it computes itself from the
snapshot, split, image and trainer code it opened, never the values it was told (pure reads)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contract import WorkerObservation
from ..data import Split, snapshot_digest
from ..errors import UsageError
from ..image import image_digest
from ..trainer import trainer_identity


def observe(snapshot_path: str, split: Split, image: Mapping[str, Any], trainer_target: str) -> tuple[WorkerObservation, str]:
    """The observation, and why the trainer could not be identified here ("" when it could)."""
    problem = ""
    try:
        trainer = trainer_identity(trainer_target)
    except UsageError as exc:  # the trainer does not import here: another environment than the launch's
        trainer, problem = {}, str(exc)
    return WorkerObservation(snapshot_digest(snapshot_path), split.digest, split.method.value, image_digest(image), trainer), problem
