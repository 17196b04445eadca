"""An unchanged Hugging Face ``transformers.Trainer`` under the governance: one callback and one resume line.

The user builds their ``Trainer`` as they always do and adds ``Governed(run)`` (the run context of
the function form, ``trainer/run.py``) as a callback and its ``compute_metrics``; they train with
``trainer.train(resume_from_checkpoint=checkpoint)`` inside ``with resume_from(run) as checkpoint``.
The Trainer keeps its own loop, optimizer, scheduler, RNGs, data order and checkpoint format; the
callback only tells the run of each optimizer step and does what the run says is due:

- a milestone: the Trainer evaluates (its ``eval_dataset`` is the run's validation examples, in
  order), ``compute_metrics`` keeps the probabilities, ``on_evaluate`` hands them to ``run.validate``
  with the loss the Trainer logged at that step; pruned or cancelled: leave without saving;
- a checkpoint (the cadence, the final step, the scheduler's signal): the Trainer writes
  ``checkpoint-N/`` and ``on_save`` moves it into ``run.checkpoint_dir()`` (the toolkit's claimed,
  exclusive, digested checkpoint; nothing is left in ``output_dir``); the signal then leaves;
- resume: the directory comes back from ``run.restore()`` and the Trainer restores everything itself,
  skipping the epoch's consumed batches (exact mid-epoch; a model whose checkpoint keys changed names,
  transformers 5.25's ViT, does not resume exactly and the launch's resume check refuses it).

- a gang (a trial of several ranks): the Trainer runs its own DistributedDataParallel over the ranks
  parcel_hpc started (accelerate reads their ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``). It writes
  the model, optimizer, scheduler and state from rank 0 alone and each rank's generators on that rank,
  so each rank's part of the checkpoint is what it wrote (``saved_by``), and a resuming rank reads rank
  0's part with its own generators beside it.

``TrainingArguments`` that would fight the governance are refused in one line (``ungovernable``).
Must not: be imported by the core (it imports transformers); read the environment or a clock.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, EvalPrediction

from parcel_hpc.trainer import Restored, Run
from parcel_hpc.trainer import TrainerState as SavedState
from parcel_hpc.trainer.run import LoopError

CHECKPOINT = "checkpoint"  # the Trainer's checkpoint-N/ inside the toolkit's checkpoint directory
LOCAL_REPORTERS = frozenset({"tensorboard"})  # report_to integrations that write local files only
TRAINING_LOGS = ("loss", "grad_norm", "learning_rate")  # what a training log of the Trainer's holds


class UngovernableArguments(LoopError):
    """``TrainingArguments`` set up so the run cannot govern the Trainer: the trial (or the launch) fails."""


def ungovernable(args: Any, steps: int, seed: int, world_size: int = 1) -> str | None:
    """What in ``args`` (a ``TrainingArguments``) the governance cannot work with, with the fix; None:
    nothing. ``world_size``: the trial's ranks (``run.world_size``)."""

    def value(name: str) -> Any:
        got = getattr(args, name, None)
        return getattr(got, "value", got)  # the Trainer's string enums as their strings

    if world_size > 1 and value("world_size") != world_size:
        return (
            f"the Trainer runs on {value('world_size')} process(es) and the trial is a gang of {world_size} ranks: its TrainingArguments did not "
            "take up the ranks' RANK, WORLD_SIZE and MASTER_ADDR (set for every rank); build them in the trial's function, with no "
            "accelerate state made for another world before them"
        )
    if world_size > 1 and (value("fsdp") or value("deepspeed")):
        return (
            "TrainingArguments(fsdp/deepspeed) shards the model across the gang, and parcel_hpc resumes a Hugging Face gang from rank 0's "
            "replicated state; leave fsdp and deepspeed unset (DistributedDataParallel)"
        )
    if value("max_steps") != steps:
        return f"TrainingArguments(max_steps={value('max_steps')}) is not the trial's length {steps}; set max_steps=run.budget.steps"
    if value("save_strategy") != "no":
        return f"TrainingArguments(save_strategy={value('save_strategy')!r}) saves on its own cadence; set save_strategy='no' (the run says when to save)"
    if value("seed") != seed or value("data_seed") not in (None, seed):
        return f"TrainingArguments(seed={value('seed')}, data_seed={value('data_seed')}) is not the trial's seed {seed}; set seed=run.seed"
    if value("save_only_model"):
        return "TrainingArguments(save_only_model=True) saves no optimizer, scheduler or RNGs, so nothing resumes; leave it False"
    if value("ignore_data_skip"):
        return "TrainingArguments(ignore_data_skip=True) replays consumed batches on resume; leave it False"
    if value("load_best_model_at_end"):
        return "TrainingArguments(load_best_model_at_end=True) swaps the trained model; leave it False (selection picks the best trial)"
    remote = sorted(set(value("report_to") or ()) - LOCAL_REPORTERS)
    if remote or value("push_to_hub"):
        return f"TrainingArguments({f'report_to={remote}' if remote else 'push_to_hub=True'}) sends the run elsewhere; set report_to='none' and push_to_hub=False (parcel_hpc records and releases the run)"
    return None


def probabilities(logits: Any) -> np.ndarray:
    """The positive class's probability from a binary classifier's logits: (n, 2) by softmax, (n,) or (n, 1) by sigmoid."""
    out = np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float64)
    if out.ndim == 2 and out.shape[1] == 2:
        shifted = out - out.max(axis=1, keepdims=True)
        return np.exp(shifted[:, 1]) / np.exp(shifted).sum(axis=1)
    if out.ndim == 1 or (out.ndim == 2 and out.shape[1] == 1):
        return 1.0 / (1.0 + np.exp(-out.reshape(-1)))
    raise LoopError(f"the model's logits have shape {out.shape}; a binary classifier gives (n, 2) or (n, 1)")


@contextmanager
def saved_checkpoint(state: SavedState) -> Iterator[Path]:
    """The Trainer's ``checkpoint-N/`` a ``Governed`` run saved in ``state``, written back to a private folder
    (``from_pretrained`` it for serving)."""
    restored = Restored(0, state)
    if not restored.has_files:
        raise LoopError("the state holds no Trainer checkpoint; it was not saved by parcel_hpc.integrations.huggingface.Governed")
    with restored.files() as root:
        yield root / CHECKPOINT


@contextmanager
def resume_from(run: Run) -> Iterator[str | None]:
    """``trainer.train(resume_from_checkpoint=...)``'s argument: the trial's last checkpoint, None on a fresh start.
    A gang's rank reads rank 0's part (the model, optimizer, scheduler and Trainer state, replicated) with
    its own generators beside it, one folder as the Trainer wrote it."""
    restored = run.restore()
    if restored is None:
        yield None
        return
    with saved_checkpoint((restored if run.rank == 0 else restored.of_rank(0)).state) as checkpoint:
        if run.rank != 0:
            with saved_checkpoint(restored.state) as own:
                for path in own.iterdir():
                    shutil.move(path, checkpoint / path.name)
        yield str(checkpoint)


def saved_by(name: str, rank: int) -> bool:
    """Whether ``rank`` wrote the entry ``name`` of the Trainer's ``checkpoint-N/``: under DDP each rank
    writes its own ``rng_state_<rank>.pth`` and rank 0 everything else."""
    per_rank = re.fullmatch(r"rng_state_(\d+)\.pth", name)
    return int(per_rank.group(1)) == rank if per_rank else rank == 0


class Governed(TrainerCallback):
    """The callback a user adds to their ``Trainer`` (``callbacks=[governed], compute_metrics=governed.compute_metrics``)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._logging = 0  # a milestone step whose training log is asked for: run.stepped waits for it
        self._validating = 0  # the milestone step whose evaluation goes to run.validate
        self._probabilities: np.ndarray | None = None

    def compute_metrics(self, prediction: EvalPrediction) -> dict[str, float]:
        """The Trainer's evaluation, kept for ``run.validate``; the eval set must be the run's validation examples."""
        labels = np.asarray(prediction.label_ids).reshape(-1)
        expected = np.asarray(self.run.data.validation.labels).astype(labels.dtype)
        if labels.shape != expected.shape or not np.array_equal(labels, expected):
            raise LoopError("the Trainer's eval_dataset is not the run's validation examples in their order; build it from run.data.validation")
        self._probabilities = probabilities(prediction.predictions)
        return {}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if (refused := ungovernable(args, self.run.budget.steps, self.run.seed, self.run.world_size)) is not None:
            raise UngovernableArguments(refused)
        if state.global_step != self.run.step:
            raise LoopError(
                f"the Trainer starts at step {state.global_step} and the run's last checkpoint is step {self.run.step}; "
                "train inside `with resume_from(run) as checkpoint:` with trainer.train(resume_from_checkpoint=checkpoint)"
            )

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        step = state.global_step
        if self.run.budget.is_milestone(step):  # the step's loss is logged next: run.stepped gets it in on_log
            self._logging, control.should_log = step, True
            return control
        lr = kwargs["lr_scheduler"].get_last_lr()[0]
        return self._stepped(step, {"learning_rate": lr}, control)

    def on_log(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, logs: Mapping[str, float] | None = None, **kwargs: Any
    ) -> TrainerControl:
        if self._logging != state.global_step:  # an evaluation's log, or a log at the user's own cadence
            return control
        self._logging = 0
        return self._stepped(state.global_step, {k: v for k, v in (logs or {}).items() if k in TRAINING_LOGS}, control)

    def _stepped(self, step: int, metrics: Mapping[str, float], control: TrainerControl) -> TrainerControl:
        due = self.run.stepped(step, metrics)
        control.should_save = due.checkpoint
        control.should_evaluate = control.should_evaluate or due.validate  # the user's own evaluations go on
        self._validating = step if due.validate else 0
        self._probabilities = None  # only this milestone's evaluation may be handed to run.validate
        control.should_training_stop = control.should_training_stop or self.run.should_stop
        return control

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        if self._validating != state.global_step:  # an evaluation at the user's own cadence
            return control
        self._validating = 0
        if self._probabilities is None:
            raise LoopError("the Trainer evaluated without the run's compute_metrics; pass Trainer(compute_metrics=governed.compute_metrics)")
        probabilities, self._probabilities = self._probabilities, None
        self.run.validate(probabilities)
        if self.run.leaves_unsaved:  # pruned or cancelled: leave without saving (a requeue at a milestone still saves)
            control.should_save, control.should_training_stop = False, True
        return control

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        written = Path(str(args.output_dir)) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if self.run.world_size > 1:  # ranks sharing an output_dir: every rank's files are there before any moves
            torch.distributed.barrier()
        with self.run.checkpoint_dir() as directory:  # the toolkit's copy is the only one: this rank's part
            (directory / CHECKPOINT).mkdir()
            for path in sorted(written.iterdir()):
                if saved_by(path.name, self.run.rank):
                    shutil.move(path, directory / CHECKPOINT / path.name)
        with contextlib.suppress(OSError):  # another rank's files still there (a shared output_dir): the last rank removes it
            written.rmdir()
