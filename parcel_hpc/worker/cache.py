"""What one worker process observed once and may reuse for the next trial of its pack.

A packed task runs several trials in turn in one process; each is still admitted on what the
process observes, but hashing the snapshot, the environment and the trainer's code, and loading and
preprocessing the partitions, happen once. A file's digest and arrays are reused only while the file
is the one that was read (same device, inode, size, modification and change times); a changed file
is read again. The environment and the trainer's code are those already imported into this process, which
cannot change under it, so they are observed once. The budget journal stays open (it only grows).

Must not: share anything a trainer can change: each trial gets its own ``TrainingData`` (the arrays
are read-only) with its own record of requests for the final partition.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from parcel_hpc.budget import SearchBudget
from parcel_hpc.data import Split, snapshot_digest
from parcel_hpc.errors import UsageError
from parcel_hpc.fsio import canonical_json
from parcel_hpc.governance.admission import WorkerObservation
from parcel_hpc.governance.contract import Contract
from parcel_hpc.governance.image import image_digest
from parcel_hpc.trainer import TrainingData, load_training_data
from parcel_hpc.trainer.target import observed_identity


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class WorkerCache:
    def __init__(self) -> None:
        self._snapshots: dict[tuple, str] = {}
        self._images: dict[str, str] = {}
        self._trainers: dict[tuple[str, str], dict[str, Any]] = {}
        self._data: dict[tuple, TrainingData] = {}
        self._budgets: dict[tuple, SearchBudget] = {}

    def budget(self, search_dir: os.PathLike, contract: Contract) -> SearchBudget:
        """The search's reservation journal, kept open: each trial of a pack reads only the entries
        appended since the last one's, not the whole journal again."""
        key = (str(search_dir), contract.digest)
        if key not in self._budgets:
            self._budgets[key] = SearchBudget(search_dir, contract)
        return self._budgets[key]

    def observe(
        self,
        snapshot_path: str,
        split: Split,
        image: Mapping[str, Any],
        trainer: Mapping[str, Any],
        search_dir: os.PathLike,
        fence: Callable[[], None],
    ) -> tuple[WorkerObservation, str]:
        """What this process has in hand: digests it computes itself from the snapshot, split, image
        and trainer code it opened (the search's copy), never the values it was told; and why the
        trainer could not be identified here ("" when it could). ``fence`` is called once the
        snapshot is read and before the trainer's code is imported: its import is trainer code."""
        snapshot, image_digest = self._snapshot(snapshot_path), self._image(image)
        fence()
        problem = ""
        try:
            found = self._trainer(trainer, search_dir)
        except UsageError as exc:  # the trainer does not import here: another environment than the launch's
            found, problem = {}, str(exc)
        return WorkerObservation(snapshot, split.digest, split.method.value, image_digest, found), problem

    def training_data(self, snapshot_path: str, split: Split, preprocessing: Mapping[str, Any], fold: int = 0) -> TrainingData:
        """The loader's arrays for fold ``fold`` of this trial, read before the process is fenced
        (admission then hashes the same file, ``observe``); a later trial of the pack takes them from here."""
        key = (_file_key(snapshot_path), split.digest, canonical_json(dict(preprocessing)), fold)
        data = self._data.get(key)
        if data is None:
            data = self._data[key] = load_training_data(snapshot_path, split, preprocessing, verify_digest=False, fold=fold)
        return replace(data, _asked_for_final=[])  # this trial's own record of requests for the final partition

    def _snapshot(self, path: str) -> str:
        try:
            key = _file_key(path)
        except OSError:
            return snapshot_digest(path)  # says what is wrong with the file, as without a cache
        if key not in self._snapshots:
            self._snapshots[key] = snapshot_digest(path)
        return self._snapshots[key]

    def _image(self, image: Mapping[str, Any]) -> str:
        kind = image.get("kind", "computed")
        if kind == "computed":  # this process's own environment: the same for every trial it runs
            if kind not in self._images:
                self._images[kind] = image_digest(image)
            return self._images[kind]
        if kind == "archive":
            try:
                key = repr(_file_key(str(image["path"])))
            except OSError:
                return image_digest(image)  # says what is wrong with the archive, as without a cache
            if key not in self._images:
                self._images[key] = image_digest(image)
            return self._images[key]
        return image_digest(image)  # given: read from the environment, cheap

    def _trainer(self, identity: Mapping[str, Any], search_dir: os.PathLike) -> dict[str, Any]:
        key = (str(search_dir), canonical_json(dict(identity)))
        if key not in self._trainers:
            self._trainers[key] = observed_identity(identity, search_dir)
        return self._trainers[key]
