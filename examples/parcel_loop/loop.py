"""A plain PyTorch loop on the raw parcel frames, kept as its author wrote it: parcel_hpc wraps it
through the run context (docs/bring-your-own-model.md, "Keep your loop"). The lines parcel_hpc asks
for are marked ``# parcel_hpc``: the decorator, the restore, one ``run.stepped`` per step, the save and
the validation it says are due, and the return it says is due.

What makes a preempted trial end with the uninterrupted one's metric: every generator is seeded
from ``run.seed``, each step's batch is a function of the seed and the step (so a resumed loop draws
the batches the uninterrupted one would), and the saved state holds the model, the optimizer and
the LR scheduler, whose cosine runs over the trial's own length (``run.budget.steps``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from parcel_hpc.trainer import Param, Run, TrainerState, TrainingData, loop
from parcel_hpc.trainer import torch as parcel_torch


class Net(nn.Module):
    """Two 3x3 convolution blocks (ReLU, 2x2 max pool), the map's mean and max, a linear head:
    logits from raw frames (n, H, W) in 0..1. The train partition's pixel statistics are buffers,
    so a saved model serves raw frames alone."""

    def __init__(self, width: int, pixel_mean: float = 0.0, pixel_std: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean))
        self.register_buffer("pixel_std", torch.tensor(pixel_std))
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(4 * width, 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.features(((frames - self.pixel_mean) / self.pixel_std).unsqueeze(1))
        return self.head(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)).squeeze(1)


def probabilities(model: nn.Module, frames: np.ndarray) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        out = torch.sigmoid(model(torch.tensor(np.asarray(frames, dtype=np.float32)))).double().numpy()
    model.train()
    return out


def load(state: TrainerState, params: Mapping[str, Any], seed: int, data: TrainingData) -> Callable[[np.ndarray], np.ndarray]:  # parcel_hpc
    """The served model: built without examples, given the saved state, raw frames to probabilities."""
    model = Net(int(params["width"]))
    parcel_torch.unpack(state, {"model": model}, rngs=False)
    return lambda frames: probabilities(model, frames)


PARAMETERS = {"lr": Param(float), "width": Param(int, default=8), "batch_size": Param(int, default=32)}


@loop(parameters=PARAMETERS, load=load)  # parcel_hpc
def train(run: Run) -> None:
    fit(run, compiled=False)


@loop(parameters=PARAMETERS, load=load)  # parcel_hpc
def train_compiled(run: Run) -> None:
    """The same loop with its training forward compiled by ``torch.compile`` (inductor: C++ kernels on
    the CPU). Every batch has one shape, so it compiles once per process; validation and serving run
    the module uncompiled. Under the final partition's fence the compiler's programs are allowed and
    recorded (docs/faults-and-inputs.md, "The final partition's fence")."""
    fit(run, compiled=True)


def fit(run: Run, compiled: bool) -> None:
    parcel_torch.deterministic()
    parcel_torch.seed_everything(run.seed)
    frames = torch.tensor(np.asarray(run.data.train.images))
    labels = torch.tensor(np.asarray(run.data.train.labels), dtype=torch.float32)
    model = Net(int(run.params["width"]), frames.mean().item(), frames.std().item())
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(run.params["lr"]))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=run.budget.steps)  # the trial's length, never a second parameter
    forward = torch.compile(model, dynamic=False) if compiled else model  # shares the module's parameters: the state is the same
    stateful = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    batch_size = min(int(run.params["batch_size"]), len(labels))
    per_epoch = len(labels) // batch_size

    def batch(step: int) -> torch.Tensor:
        epoch, i = divmod(step - 1, per_epoch)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(run.seed * 100_003 + epoch))
        return order[i * batch_size : (i + 1) * batch_size]

    start = 0
    if (saved := run.restore()) is not None:  # parcel_hpc
        start = parcel_torch.unpack(saved.state, stateful)  # parcel_hpc
    for step in range(start + 1, run.budget.steps + 1):
        idx = batch(step)
        loss = nn.functional.binary_cross_entropy_with_logits(forward(frames[idx]), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        due = run.stepped(step, {"loss": loss.item(), "lr": scheduler.get_last_lr()[0]})  # parcel_hpc
        if due.checkpoint:  # parcel_hpc
            run.save(parcel_torch.pack(stateful, step=step))  # parcel_hpc
        if due.validate:  # parcel_hpc
            run.validate(probabilities(model, run.data.validation.images))  # parcel_hpc
        if run.should_stop:  # parcel_hpc
            return  # parcel_hpc
