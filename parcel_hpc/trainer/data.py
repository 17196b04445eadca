"""The toolkit's loader: what data a trainer gets, as arrays, and the one door it does not get.

Owns ``TrainingData``: the train and validation partitions of the pinned split, each with its raw
images, the pinned preprocessing's features (fitted on train only), labels and slice columns
(damage type, camera class, shipment). A trainer never receives a path. The preprocessing is fitted
when a trainer first asks for a feature or its statistics: one that learns its own features from the
images (every torch example here) never pays for a fit it does not use, on every trial. Asking for the final
partition raises ``FinalPartitionRefused`` and is remembered even when the trainer catches it:
the worker then records the trial ``rejected``.

``serving_data`` is the other kind a trainer is built with: no examples at all, for the served model
(``trainer.served``), which must answer from its state alone.

Must not: open the final partition, or let a trainer reach the snapshot's files through it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from parcel_hpc.checkpoints.cadence import Cadence, due
from parcel_hpc.data import Partition, Split, load_partition
from parcel_hpc.data.preprocessing import Preprocessor
from parcel_hpc.governance.outcome import GovernanceRefusal, Outcome
from parcel_hpc.gpus import visible_devices

FINAL_PARTITION_OUTCOME = Outcome.REJECT_FINAL_PARTITION
SPLITS = ("train", "validation")


class DevicesNotGranted(RuntimeError):
    """A trainer asked for more GPUs than the scheduler granted its attempt: the trial fails ``devices_not_granted``."""


@dataclass(frozen=True)
class Devices:
    """The GPUs an attempt was granted: ``count`` of them, bound to ``visible`` where they are this process's.

    ``visible`` holds the scheduler's names (``CUDA_VISIBLE_DEVICES``: indices or UUIDs). It is empty
    where none is granted, and where they are granted but not here: the launch's preflight and
    ``check-trainer`` build the trainer on the login node's CPU with the count the search will get.
    """

    count: int = 0
    visible: tuple[str, ...] = ()

    def require(self, n: int) -> None:
        """``DevicesNotGranted`` when ``n`` devices are more than the grant."""
        if n > self.count:
            raise DevicesNotGranted(
                f"the trainer asks for {n} GPU{'s' if n != 1 else ''} and the attempt was granted {self.count}; "
                "raise resources.gpus or ask for fewer (a trainer uses only what the scheduler gave it)"
            )

    @classmethod
    def from_env(cls, granted: int | None, cuda_visible_devices: str) -> Devices:
        """What a worker was given: the scheduler's count where it says one, else the visible devices."""
        visible = visible_devices(cuda_visible_devices)
        return cls(len(visible) if granted is None else int(granted), visible)


@dataclass(frozen=True)
class Budget:
    """What a trainer is given to spend: the search's ``train.steps`` (in the trainer's ``unit``), the
    pruner's milestones and the checkpoint cadence. A schedule reads ``steps`` from here (a cosine
    over the trial's whole length), never from a second parameter kept equal to it by hand."""

    steps: int = 1  # the default: a served model's, which has no steps to spend
    milestones: tuple[int, ...] = ()
    cadence: Cadence = Cadence(every_steps=1)  # when a checkpoint is due (and always at the last step)
    unit: str = "step"

    def is_milestone(self, step: int) -> bool:
        return step in self.milestones or step == self.steps

    def checkpoint_due(self, step: int, seconds_since_save: float) -> bool:
        return step == self.steps or due(step, seconds_since_save, self.cadence)


class FinalPartitionRefused(GovernanceRefusal):
    """A trainer asked for the protected final partition."""

    def __init__(self, detail: str) -> None:
        super().__init__(FINAL_PARTITION_OUTCOME, detail)


@dataclass(frozen=True)
class Examples:
    """One partition as read-only arrays, one entry per frame."""

    images: np.ndarray  # float32 (n, H, W) in 0..1: the raw frames (for trainers that learn their own features)
    _features: np.ndarray | Callable[[], np.ndarray]  # ``features``, or how to make them when first asked
    labels: np.ndarray  # bool (n,): needs_review
    damage_type: np.ndarray  # str (n,): slice column
    camera_class: np.ndarray  # str (n,): slice column
    shipment_id: np.ndarray  # str (n,): the group of the split (no shipment is in two partitions)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def features(self) -> np.ndarray:
        """float64 (n, d): the pinned preprocessing, fitted on the train partition."""
        return self._features if isinstance(self._features, np.ndarray) else self._features()

    @classmethod
    def none(cls, frame_shape: tuple[int, int], width: int) -> Examples:
        """No examples, with the shapes and dtypes of real ones: what a served trainer is built with."""
        text = np.array([], dtype=str)
        return cls(np.zeros((0, *frame_shape), np.float32), np.zeros((0, width)), np.zeros(0, bool), text, text, text)

    @classmethod
    def of(cls, part: Partition, features: np.ndarray | Callable[[], np.ndarray]) -> Examples:
        if not callable(features):
            features = np.asarray(features)
            features.flags.writeable = False
        return cls(part.images, features, part.labels, part.damage_type, part.camera_class, part.shipment_id)


class Fit:
    """The pinned preprocessing fitted on a train partition's images, with both partitions' features:
    made once, by whichever thread asks first. Its revision and pool are checked on one frame when it
    is made, so a bad one is said where the data is loaded, not at the first feature."""

    def __init__(self, preprocessing: Mapping[str, Any], train_images: np.ndarray, validation_images: np.ndarray) -> None:
        self.revision, self.pool = str(preprocessing["revision"]), int(preprocessing["pool"])
        Preprocessor.check(self.revision, self.pool, train_images[:1] if len(train_images) else validation_images[:1])
        self._images: tuple[np.ndarray, np.ndarray] | None = (train_images, validation_images)
        self._lock = threading.Lock()
        self._fitted: tuple[Preprocessor, np.ndarray, np.ndarray] | None = None
        _FITS.add(self)

    def fitted(self) -> tuple[Preprocessor, np.ndarray, np.ndarray]:
        """The preprocessor and the train and validation features (read-only)."""
        if (done := self._fitted) is not None:  # every step of a trainer that reads features asks: no lock once made
            return done
        with self._lock:
            if self._fitted is None:
                train, validation = self._images  # type: ignore[misc]  # set until fitted
                preprocessor, x_train = Preprocessor.fit_transform(self.revision, self.pool, train)
                x_validation = preprocessor(validation)
                for arr in (x_train, x_validation):
                    arr.flags.writeable = False
                self._fitted, self._images = (preprocessor, x_train, x_validation), None
            return self._fitted

    def features(self, partition: str) -> np.ndarray:
        _, train, validation = self.fitted()
        return train if partition == "train" else validation

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a trainer handing its data to a process it spawns): fitted, with no lock."""
        return {"revision": self.revision, "pool": self.pool, "fitted": self.fitted()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.revision, self.pool, self._fitted = state["revision"], state["pool"], state["fitted"]
        self._images, self._lock = None, threading.Lock()


# A child forked while another thread was fitting (a data loader's worker) would inherit a held
# lock and wait on it for ever: every fit's lock starts free in the child, which fits for itself.
_FITS: weakref.WeakSet[Fit] = weakref.WeakSet()


def _free_locks_in_child() -> None:
    for fit in list(_FITS):
        fit._lock = threading.Lock()


os.register_at_fork(after_in_child=_free_locks_in_child)


@dataclass(frozen=True)
class TrainingData:
    """What a trainer is built with: two partitions and the fitted preprocessing, never a path."""

    train: Examples
    validation: Examples
    _preprocessing: Preprocessor | Fit  # ``preprocessing``, or the fit that makes it when first asked
    split_revision: str
    devices: Devices = Devices()  # the GPUs this attempt may use (parcel_hpc.trainer.torch.device picks them)
    budget: Budget = Budget()  # the steps, milestones and checkpoint cadence of the trial it trains
    rank: int = 0  # this process's rank in the trial's gang (0 of 1 for a trial of one rank)
    world_size: int = 1  # the gang's ranks (torch.distributed's RANK and WORLD_SIZE, which the environment holds too)
    _asked_for_final: list[str] = field(default_factory=list, repr=False, compare=False)

    def partition(self, name: str) -> Examples:
        """``"train"`` or ``"validation"``; the final partition is refused (and the trial rejected)."""
        if name in SPLITS:
            return getattr(self, name)
        if str(name).lower().startswith("final") or str(name).lower() in ("test", "holdout"):
            self._asked_for_final.append(str(name))
            raise FinalPartitionRefused(
                f"a trainer asked for the {name!r} partition of split {self.split_revision}; only the one-time final evaluation reads it"
            )
        raise KeyError(f"partition {name!r} is unknown; use 'train' or 'validation'")

    @property
    def preprocessing(self) -> Preprocessor:
        """The fitted preprocessing: apply it to raw images in a serving path; keep its ``arrays()`` in the state."""
        return self._preprocessing.fitted()[0] if isinstance(self._preprocessing, Fit) else self._preprocessing

    def without_examples(self) -> TrainingData:
        """``serving_data`` for this data's frames and preprocessing: what its trainer is served with."""
        spec = {"revision": self._preprocessing.revision, "pool": self._preprocessing.pool}
        _, height, width = self.validation.images.shape
        return serving_data((height, width), spec, self.split_revision)

    @property
    def asked_for_final(self) -> tuple[str, ...]:
        """Every request for the final partition so far, caught by the trainer or not."""
        return tuple(self._asked_for_final)


def serving_data(frame_shape: tuple[int, int], preprocessing: Mapping[str, Any], split_revision: str) -> TrainingData:
    """What a served trainer is built with (``Trainer.serve``: "from the trainer's state alone"): no
    examples in either partition, the preprocessing unfitted; ``load_state`` then gives it everything."""
    unfitted = Preprocessor.unfitted(preprocessing, frame_shape)
    empty = Examples.none(frame_shape, len(unfitted.mean))
    return TrainingData(empty, empty, unfitted, split_revision)


def load_training_data(
    snapshot_path: str | os.PathLike, split: Split, preprocessing: Mapping[str, Any], *, verify_digest: bool = True, fold: int = 0
) -> TrainingData:
    """Read train and validation of ``split``'s fold ``fold`` and fit the pinned preprocessing on that
    fold's train only (a K-fold trial's fold run sees no statistic of its own validation fold).

    ``verify_digest=False`` only where the caller has just hashed this very file (the worker's admission).
    """
    train = load_partition(snapshot_path, split, "train", verify_digest=verify_digest, fold=fold)
    validation = load_partition(snapshot_path, split, "validation", verify_digest=False, fold=fold)  # the same file, just verified
    return _fitted_when_asked(train, validation, preprocessing, split.revision)


def _fitted_when_asked(train: Partition, validation: Partition, preprocessing: Mapping[str, Any], split_revision: str) -> TrainingData:
    fit = Fit(preprocessing, train.images, validation.images)
    return TrainingData(Examples.of(train, partial(fit.features, "train")), Examples.of(validation, partial(fit.features, "validation")), fit, split_revision)


def load_refit_data(snapshot_path: str | os.PathLike, split: Split, preprocessing: Mapping[str, Any]) -> TrainingData:
    """Every non-final frame of a K-fold ``split`` to train on (each fold and ``train_only``: a
    selected trial's refit), the pinned preprocessing fitted on all of them. Its validation part is
    the last fold, which it trains on too: no held-out frame is left, so the refit's loop values are
    not validation figures (its folds' out-of-fold predictions are)."""
    last = split.fold_count - 1
    rest = load_partition(snapshot_path, split, "train", verify_digest=False, fold=last)
    validation = load_partition(snapshot_path, split, "validation", verify_digest=False, fold=last)
    order = np.argsort(np.concatenate([rest.rows, validation.rows]), kind="stable")

    def joined(f: str) -> np.ndarray:
        return np.concatenate([getattr(rest, f), getattr(validation, f)])[order]

    train = replace(
        rest,
        rows=joined("rows"),
        images=joined("images"),
        labels=joined("labels"),
        damage_type=joined("damage_type"),
        camera_class=joined("camera_class"),
        shipment_id=joined("shipment_id"),
        parcel_id=joined("parcel_id"),
        frame=joined("frame"),
    )
    return _fitted_when_asked(train, validation, preprocessing, split.revision)
