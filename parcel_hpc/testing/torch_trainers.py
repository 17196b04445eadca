"""PyTorch trainers that resume inexactly on purpose, each the way a real one does, for the launch's
resume check (``trainer/resume.py``). ``Resumes`` is the correct one they each break:

- ``LeavesOutScheduler``: a cosine LR schedule over ``data.budget.steps``, left out of the state;
- ``UnseededDataOrder``: shuffles with torch's global generator and never seeds it;
- ``LibraryRNG``: subsamples each batch with a library's generator that has no getter (LightGBM-style);
- ``loop_leaves_out_scheduler``: the issue's user in the function form (``@loop``), their own loop
  saving the model and the optimizer and not the cosine schedule.

Choose one with ``trainer.target=parcel_hpc.testing.torch_trainers:<Name>`` (needs ``parcel_hpc[torch]``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from parcel_hpc.trainer import Param, Run, Trainer, TrainerState, TrainingData, loop, threads
from parcel_hpc.trainer import torch as parcel_torch


class _Library:
    """A library with a process-wide generator it can seed and draw from but never hand out or take back."""

    def __init__(self) -> None:
        self._gen = np.random.default_rng(0)

    def seed(self, seed: int) -> None:
        self._gen = np.random.default_rng(seed)

    def bag(self, n: int) -> np.ndarray:
        return self._gen.random(n) < 0.7


LIBRARY = _Library()


class Resumes(Trainer):
    """Logistic regression on the pinned features with AdamW and a cosine schedule over the trial's steps."""

    parameters = {"lr": Param(float), "batch_size": Param(int, default=8)}

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        parcel_torch.seed_everything(seed)
        self.data = data
        self.model = nn.Linear(data.train.features.shape[1], 1).double()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=float(params["lr"]))
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=data.budget.steps)
        self.batch_size = int(params["batch_size"])
        self.x = torch.tensor(np.asarray(data.train.features))
        self.y = torch.tensor(np.asarray(data.train.labels), dtype=torch.float64)
        self.steps = 0

    def _batch(self) -> torch.Tensor:
        return torch.randperm(len(self.y))[: self.batch_size]  # torch's global generator, seeded in build and saved by pack

    def step(self) -> Mapping[str, float]:
        idx = self._batch()
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(self.x[idx]).squeeze(1), self.y[idx])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.steps += 1
        return {"loss": loss.item()}

    def stateful(self) -> dict[str, parcel_torch.Stateful]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def state(self) -> TrainerState:
        return parcel_torch.pack(self.stateful(), step=self.steps)

    def load_state(self, state: TrainerState) -> None:
        self.steps = parcel_torch.unpack(state, self.stateful())

    def predict(self, split: str) -> np.ndarray:
        return self._probabilities(np.asarray(self.data.partition(split).features))

    def serve(self, images: np.ndarray) -> np.ndarray:
        return self._probabilities(self.data.preprocessing(images))

    def _probabilities(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(self.model(torch.tensor(x)).squeeze(1)).numpy()


class LeavesOutScheduler(Resumes):
    """The issue's user: the LR scheduler is not in the state, so a resumed trial restarts its schedule."""

    def stateful(self) -> dict[str, parcel_torch.Stateful]:
        return {"model": self.model, "optimizer": self.optimizer}


class UnseededDataOrder(Resumes):
    """Seeds its weights from the seed but draws its batches from torch's global generator, never seeded."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        torch.seed()  # the global generator from the OS: the data order no seed decides

    def state(self) -> TrainerState:
        return parcel_torch.pack(self.stateful(), step=self.steps)

    def load_state(self, state: TrainerState) -> None:
        self.steps = parcel_torch.unpack(state, self.stateful(), rngs=False)


class LibraryRNG(Resumes):
    """Bags each batch with ``LIBRARY``'s generator, seeded in build: no getter, so no state holds it."""

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        LIBRARY.seed(seed)

    def _batch(self) -> torch.Tensor:
        idx = super()._batch()
        return idx[torch.from_numpy(LIBRARY.bag(len(idx)))]


def _served(state: TrainerState, params: Mapping[str, Any], seed: int, data: TrainingData) -> Any:
    """The saved model on raw frames (through the pinned preprocessing), built from the state alone."""
    model = nn.Linear(state.arrays["model/weight"].shape[1], 1).double()
    parcel_torch.unpack(state, {"model": model}, rngs=False)

    def serve(images: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(model(torch.tensor(data.preprocessing(images))).squeeze(1)).numpy()

    return serve


@loop(parameters=Resumes.parameters, load=_served)
def loop_leaves_out_scheduler(run: Run) -> None:
    """``Resumes``' model, optimizer and cosine schedule in a loop of its own, whose save leaves the schedule out."""
    parcel_torch.seed_everything(run.seed)
    x = torch.tensor(np.asarray(run.data.train.features))
    y = torch.tensor(np.asarray(run.data.train.labels), dtype=torch.float64)
    model = nn.Linear(x.shape[1], 1).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(run.params["lr"]))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=run.budget.steps)
    saved: dict[str, parcel_torch.Stateful] = {"model": model, "optimizer": optimizer}  # the scheduler forgotten
    start = 0
    if (restored := run.restore()) is not None:
        start = parcel_torch.unpack(restored.state, saved)
    for step in range(start + 1, run.budget.steps + 1):
        idx = torch.randperm(len(y))[: int(run.params["batch_size"])]
        loss = nn.functional.binary_cross_entropy_with_logits(model(x[idx]).squeeze(1), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        due = run.stepped(step, {"loss": loss.item()})
        if due.checkpoint:
            run.save(parcel_torch.pack(saved, step=step))
        if due.validate:
            with torch.no_grad():
                run.validate(torch.sigmoid(model(torch.tensor(np.asarray(run.data.validation.features))).squeeze(1)).numpy())
        if run.should_stop:
            return


THREADS_FILE_ENV = "PARCEL_TEST_THREADS_FILE"  # where ``record_threads`` writes what it saw


def record_threads(params: Mapping[str, Any], step: int) -> None:
    """A step hook (``PARCEL_HPC_STEP_HOOK``): at step 1, the thread counts this worker computes with."""
    if step == 1:
        seen = {"torch": torch.get_num_threads(), "env": {name: os.environ.get(name) for name in threads.THREAD_ENV}}
        with open(os.environ[THREADS_FILE_ENV], "x") as fh:
            json.dump(seen, fh)
