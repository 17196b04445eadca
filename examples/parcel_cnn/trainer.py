"""A small CNN on the raw parcel frames, in plain PyTorch, with the few lines parcel_hpc asks for.

What makes a preempted trial end with the uninterrupted one's metric: every generator is seeded
from ``seed`` (``seed_everything``), kernels are deterministic, and ``state()`` holds the model,
the optimizer, every RNG (``parcel_torch.pack``) and where the current epoch's batch order stands:
the generator's state when the epoch began and how many batches of it were taken. Built without
frames (``parcel_hpc.trainer.serving_data``) it makes no loader: a served model only loads its state
and serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from parcel_hpc.trainer import Param, Trainer, TrainerState, TrainingData
from parcel_hpc.trainer import torch as parcel_torch

OPTIMIZERS = {
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=1e-4),
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True),
}


class ParcelNet(nn.Module):
    """Conv blocks (3x3 conv, batch norm, ReLU, 2x2 max pool) doubling the channels at each, then
    the map's global mean and max side by side (damage is local: how much of the frame, and is it
    anywhere), dropout and a linear head. Takes raw frames (n, H, W) in 0..1; the train partition's
    pixel statistics are buffers, so a saved model serves raw images alone."""

    def __init__(self, width: int, depth: int, dropout: float, pixel_mean: float = 0.0, pixel_std: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean))
        self.register_buffer("pixel_std", torch.tensor(pixel_std))
        blocks: list[nn.Module] = []
        channels = 1
        for i in range(depth):
            out = width * 2**i
            blocks += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(2 * channels, 1))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.features(((frames - self.pixel_mean) / self.pixel_std).unsqueeze(1))
        # Plain reductions rather than adaptive pools: their CUDA backward has a deterministic kernel.
        pooled = torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)
        return self.head(pooled).squeeze(1)  # logits: > 0 means "needs review"


class ParcelCNN(Trainer):
    unit = "step"  # one optimizer step on one minibatch
    parameters = {
        "lr": Param(float),
        "width": Param(int, default=16),
        "depth": Param(int, default=2),
        "dropout": Param(float, default=0.1),
        "batch_size": Param(int, default=64),
        "optimizer": Param(str, default="adamw"),
        "amp": Param(bool, default=False),  # bfloat16 autocast on a GPU; no effect on the CPU
    }

    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        if params["optimizer"] not in OPTIMIZERS:
            raise ValueError(f"optimizer {params['optimizer']!r} is unknown; use one of {', '.join(OPTIMIZERS)}")
        parcel_torch.deterministic()
        parcel_torch.seed_everything(seed)
        self.device = parcel_torch.device(data)  # the GPU the scheduler granted, else the CPU
        self.amp = bool(params["amp"]) and self.device.type == "cuda"
        self.data = data
        frames = torch.tensor(np.asarray(data.train.images))
        # No frames: a served trainer (parcel_hpc.trainer.serving_data), whose pixel statistics come with its state.
        pixel = (frames.mean().item(), frames.std().item()) if len(frames) else (0.0, 1.0)
        self.model = ParcelNet(int(params["width"]), int(params["depth"]), float(params["dropout"]), *pixel).to(self.device)
        self.train_forward: Callable[[torch.Tensor], torch.Tensor] = self.model  # the training step's forward (compiled.py compiles it)
        self.optimizer = OPTIMIZERS[params["optimizer"]](self.model.parameters(), float(params["lr"]))
        self.loss = nn.BCEWithLogitsLoss()
        dataset = TensorDataset(frames, torch.tensor(np.asarray(data.train.labels), dtype=torch.float32))
        self.order = torch.Generator().manual_seed(seed)
        self.loader: DataLoader | None = None  # none for a served trainer: it never steps
        if len(dataset):
            batch_size = min(int(params["batch_size"]), len(dataset))
            self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=self.order)
            self._begin_epoch(self.order.get_state())
        self.steps = 0

    def _begin_epoch(self, order_state: torch.Tensor, taken: int = 0) -> None:
        # The loader draws an epoch's batch order from ``self.order`` when it starts iterating.
        self.epoch_order, self.taken = order_state.clone(), taken
        self.order.set_state(order_state)
        self.batches = iter(self.loader)
        for _ in range(taken):
            next(self.batches)

    def step(self) -> Mapping[str, float]:
        batch = next(self.batches, None)
        if batch is None:
            self._begin_epoch(self.order.get_state())
            batch = next(self.batches)
        self.taken += 1
        frames, labels = (t.to(self.device, non_blocking=True) for t in batch)
        self.model.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            loss = self.loss(self.train_forward(frames), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return {"loss": loss.item()}

    def state(self) -> TrainerState:
        return parcel_torch.pack(
            {"model": self.model, "optimizer": self.optimizer},
            step=self.steps,
            arrays={"batch_order/epoch_start": self.epoch_order.numpy()},
            scalars={"batch_order/taken": self.taken},
        )

    def load_state(self, state: TrainerState) -> None:
        self.steps = parcel_torch.unpack(state, {"model": self.model, "optimizer": self.optimizer})
        if self.loader is not None:
            self._begin_epoch(torch.tensor(state.arrays["batch_order/epoch_start"]), int(state.scalars["batch_order/taken"]))

    def predict(self, split: str) -> np.ndarray:
        return self.serve(self.data.partition(split).images)

    @torch.no_grad()
    def serve(self, images: np.ndarray) -> np.ndarray:
        # Raw frames -> the model's own pixel statistics and weights -> probabilities, in float32.
        self.model.eval()
        logits = self.model(torch.tensor(np.asarray(images, dtype=np.float32), device=self.device))
        return torch.sigmoid(logits).cpu().numpy().astype(np.float64)
