"""The run context: how a training loop talks to the toolkit, whoever owns the loop.

A trainer in the function form (``@loop``, ``function.py``) keeps its own loop and is handed a ``Run``;
a trainer in the class form is driven by the toolkit's own loop (``drive``) through the same ``Run``,
so there is one loop protocol and one checkpoint path. The loop reads its budget (``run.budget``:
steps, milestones, checkpoint cadence), restores (``run.restore``), tells the run after every step
(``run.stepped``), which answers what is due (a checkpoint at the cadence or on the scheduler's
signal, a validation at a milestone); it saves (``run.save`` arrays, or ``run.checkpoint_dir`` for
files a library writes itself), hands validation probabilities (``run.validate``) and returns when
``run.should_stop`` says so. The scheduler's signal only sets a flag that the next ``stepped`` reads:
nothing is ever saved inside a signal handler.

The rules every ``Run`` keeps are here; where the steps, saves and milestones go (the worker's
ledger and checkpoint store, the preflight's memory, a selection job's journal) is each subclass's.
Must not: read a path, a clock or the environment; effects belong to the subclasses.
"""

from __future__ import annotations

import enum
import math
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from parcel_hpc.trainer.base import Trainer, TrainerState, UnsavableState, checked_probabilities, finite_metrics
from parcel_hpc.trainer.data import Budget, TrainingData

FILES = "files/"  # state arrays holding the bytes of a checkpoint directory a library wrote (``checkpoint_dir``)


class Stop(enum.Enum):
    """Why a loop must return now."""

    PRUNED = "pruned"  # its milestone value lost to its peers'
    CANCELLED = "cancelled"  # its owner cancelled it
    QUARANTINED = "quarantined"  # its checkpoint directory collided with another trial's
    REJECTED = "rejected"  # it asked for the final partition
    REQUEUE = "requeue"  # the scheduler's signal or the attempt's own time limit: saved first, resumed later
    CHECKED = "checked"  # a check ran the steps it needed (the launch's preflight)

    @property
    def saves_first(self) -> bool:
        """Whether the step it stops at is checkpointed before the loop returns."""
        return self in (Stop.REQUEUE, Stop.CHECKED)


class StopTraining(BaseException):
    """A loop that called its run again after ``should_stop`` said to return. A ``BaseException``, so an
    ``except Exception`` in a loop does not swallow it."""


class LoopError(RuntimeError):
    """A loop broke the run protocol (a step out of order, a save before any step): the trial fails."""


@dataclass(frozen=True)
class Due:
    """What the loop does after the step it just told the run about."""

    checkpoint: bool  # save the whole state now (``run.save`` or ``run.checkpoint_dir``)
    validate: bool  # hand ``run.validate`` the validation probabilities now


def stopping_due(stop: Stop, milestone: bool) -> Due:
    """What a loop stopping at this step still owes: a save and the milestone, where the stop saves first."""
    return Due(checkpoint=stop.saves_first, validate=stop.saves_first and milestone)


@dataclass(frozen=True)
class Restored:
    """The last good checkpoint of the trial: the step it was taken after and its state (a gang's: this
    rank's part of it)."""

    step: int
    state: TrainerState
    # A gang's other ranks' parts of the same step, read on demand (None: a trial of one rank).
    parts: Callable[[int], TrainerState] | None = field(default=None, repr=False, compare=False)

    def of_rank(self, rank: int) -> Restored:
        """Rank ``rank``'s part of the same checkpoint: a replicated state that rank 0 alone saved (a
        Hugging Face Trainer's model and optimizer) is what every rank of a gang restores."""
        if self.parts is None:
            if rank == 0:
                return self
            raise LoopError(f"the checkpoint is one rank's; it has no part of rank {rank}")
        return Restored(self.step, self.parts(rank), self.parts)

    @property
    def has_files(self) -> bool:
        return any(name.startswith(FILES) for name in self.state.arrays)

    @contextmanager
    def files(self) -> Iterator[Path]:
        """The directory ``checkpoint_dir`` saved, written back into a private temporary folder."""
        with tempfile.TemporaryDirectory(prefix="parcel-restored-") as d:
            root = Path(d)
            for name, arr in self.state.arrays.items():
                if name.startswith(FILES):
                    path = root / name[len(FILES) :]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(np.asarray(arr, dtype=np.uint8).tobytes())
            yield root


def files_state(directory: Path, state: TrainerState | None = None) -> TrainerState:
    """``state`` (or an empty one) with every file under ``directory`` as a uint8 array ``files/<path>``:
    a library's own checkpoint rides in the same exclusive, digested checkpoint as arrays do."""
    arrays = dict(state.arrays) if state is not None else {}
    for root, _, names in sorted(os.walk(directory)):
        for name in sorted(names):
            path = Path(root) / name
            arrays[FILES + path.relative_to(directory).as_posix()] = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if not any(n.startswith(FILES) for n in arrays):
        raise LoopError(
            f"checkpoint_dir: nothing was written into {directory}; write the library's checkpoint there (e.g. trainer.save_checkpoint(d / 'last.ckpt'))"
        )
    return TrainerState(arrays, dict(state.scalars) if state is not None else {})


class Run(ABC):
    """What a training loop is given: the trial's ``params`` (declared defaults under its own values),
    ``seed``, ``data`` (arrays, never paths; ``data.devices`` is its GPU grant, ``data.budget`` its
    steps, milestones and checkpoint cadence, also ``run.budget``)."""

    def __init__(
        self, params: Mapping[str, Any], seed: int, data: TrainingData, score: Callable[[np.ndarray], float], clock: Callable[[], float] | None = None
    ) -> None:
        """``clock`` (``time.monotonic``) times a cadence in seconds; without one, no time passes for it."""
        self.params = params
        self.seed = seed
        self.data = data
        self.budget: Budget = data.budget
        self._score = score  # the contract's pinned metric on the validation labels: it alone decides pruning and selection
        self.step = 0  # the last step the loop told of
        self.stop: Stop | None = None
        self.last_saved: TrainerState | None = None
        self.saved_step = 0  # the step the last save followed
        self.value = math.nan  # the last validation value
        self.validated_step = 0  # the step it was handed at
        self._metrics: dict[str, float] = {}
        self._clock = clock or (lambda: 0.0)
        self._saved_at = self._clock()  # the last save, or the start: a cadence in seconds counts from it

    # --- what a loop calls --------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the trial's gang (0 for a trial of one rank): rank 0's decisions are the gang's."""
        return self.data.rank

    @property
    def world_size(self) -> int:
        """The trial's ranks (1 for a trial of one rank)."""
        return self.data.world_size

    def restore(self) -> Restored | None:
        """The trial's last good checkpoint (None: a fresh start). Resume after ``restored.step``."""
        self._open()
        found = self._restore()
        if found is not None:
            self.step = found.step
        self._saved_at = self._clock()
        return found

    def stepped(self, step: int, metrics: Mapping[str, float] | None = None) -> Due:
        """After each step, its metrics (every value finite; recorded with the next milestone):
        what is due now. The scheduler's signal is read here (``Stop.REQUEUE``: the checkpoint is due)."""
        self._open()
        if step != self.step + 1:
            raise LoopError(f"run.stepped({step}) after step {self.step}; tell the run of every step, in order, starting after restore()'s step")
        self._metrics = finite_metrics(metrics or {}, step)
        self.step = step
        self.stop = self._stepped(step)
        if self.stop is not None:
            # A stop that saves first (a requeue) still hands the milestone due at its step: it is scored and
            # decided before the loop leaves, so no milestone is lost to a signal; any other stop asks nothing more.
            due = stopping_due(self.stop, self.budget.is_milestone(step))
        else:
            due = Due(checkpoint=self.budget.checkpoint_due(step, self._clock() - self._saved_at), validate=self.budget.is_milestone(step))
        due, self.stop = self._agreed(step, due, self.stop)
        return due

    def save(self, state: TrainerState) -> None:
        """Checkpoint the whole state after the last step told of (atomic, exclusive, digested)."""
        if self.stop is not None and not self.stop.saves_first:
            raise StopTraining(self.stop)
        if self.step == 0:
            raise LoopError("run.save before any run.stepped; save after the step it follows")
        if not isinstance(state, TrainerState):
            raise UnsavableState(f"the state saved is a {type(state).__name__}; return (or run.save) a parcel_hpc.trainer.TrainerState(arrays, scalars)")
        state = state.checked()
        self._save(self.step, state)
        self.last_saved, self.saved_step = state, self.step
        self._saved_at = self._clock()

    @contextmanager
    def checkpoint_dir(self, state: TrainerState | None = None) -> Iterator[Path]:
        """A private directory for a library to write its own checkpoint into (a file or a folder);
        on leaving it, what was written is saved as ``save`` saves (with ``state``'s arrays, if given)."""
        with tempfile.TemporaryDirectory(prefix="parcel-checkpoint-") as d:
            yield Path(d)
            whole = files_state(Path(d), state)
        self.save(whole)

    def validate(self, probabilities: Any) -> float:
        """The validation probabilities at a milestone (one per validation example): scored with the
        contract's pinned metric, recorded; may set ``should_stop`` (pruned, cancelled)."""
        if self.stop is not None and not self.stop.saves_first:
            raise StopTraining(self.stop)
        scores = checked_probabilities(probabilities, len(self.data.validation), "validation", self.step)
        self.value, self.validated_step = float(self._score(scores)), self.step
        decided = self._validated(self.step, self.value, self.step == self.budget.steps, self._metrics)
        self.stop = decided if decided is not None else self.stop  # a prune or a cancel overrides a requeue
        self.stop = self._agreed_after_validation(self.step, self.stop)
        return self.value

    def due_after(self, step: int, saving_now: bool) -> Due:
        """What is due at ``step``, asked at the step before it (a gang's rank 0 decides a step ahead);
        ``saving_now``: the step before saves, so the cadence counts from it."""
        elapsed = 0.0 if saving_now else self._clock() - self._saved_at
        return Due(checkpoint=self.budget.checkpoint_due(step, elapsed), validate=self.budget.is_milestone(step))

    @property
    def should_stop(self) -> bool:
        """Return from the loop now (after saving, where ``stepped`` said a checkpoint is due)."""
        return self.stop is not None

    @property
    def leaves_unsaved(self) -> bool:
        """Return now without saving: pruned, cancelled, rejected or quarantined (a requeue saves first)."""
        return self.stop is not None and not self.stop.saves_first

    @property
    def done(self) -> bool:
        """The loop handed the last step's validation: the trial's result is whole, whatever stop came with it."""
        return self.validated_step == self.budget.steps

    # --- what a run does with it --------------------------------------------------------------
    def _open(self) -> None:
        if self.stop is not None:
            raise StopTraining(self.stop)

    @abstractmethod
    def _restore(self) -> Restored | None: ...

    @abstractmethod
    def _stepped(self, step: int) -> Stop | None:
        """After the step: record it; a stop the loop must obey (the signal, a time limit)."""

    @abstractmethod
    def _save(self, step: int, state: TrainerState) -> None: ...

    @abstractmethod
    def _validated(self, step: int, value: float, final: bool, metrics: Mapping[str, float]) -> Stop | None: ...

    def _agreed(self, step: int, due: Due, stop: Stop | None) -> tuple[Due, Stop | None]:
        """What every rank of the trial does after ``step``. A trial of one rank: what it decided itself;
        in a gang, rank 0 tells its peers and a peer is told (``worker/gang.py``)."""
        return due, stop

    def _agreed_after_validation(self, step: int, stop: Stop | None) -> Stop | None:
        """The stop every rank obeys after the milestone at ``step`` was scored (by rank 0, in a gang)."""
        return stop


def drive(trainer: Trainer, run: Run) -> None:
    """The toolkit's loop for a class-form trainer, already built: the same protocol a function-form
    loop follows, so both are resumed, checkpointed and scored by one path."""
    restored = run.restore()
    start = 0
    if restored is not None:
        trainer.load_state(restored.state)
        start = restored.step
    for step in range(start + 1, run.budget.steps + 1):
        due = run.stepped(step, trainer.step())
        if due.checkpoint:
            run.save(trainer.state())
        if due.validate:
            run.validate(trainer.predict("validation"))
        if run.should_stop:
            return
