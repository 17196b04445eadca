"""A small Lightning CNN on the raw parcel frames, trained by ``Trainer.fit`` as its author wrote it:
a cosine schedule over ``self.trainer.estimated_stepping_batches``, gradient clipping, a logger, a
noise augmentation drawing from torch's global generator. The lines parcel_hpc asks for are marked
``# parcel_hpc`` (docs/bring-your-own-model.md, "Lightning", counts them: 14): two imports, ``load``
(the serving entry), the decorator, the resumable loader, the callback, three Trainer arguments and
the ``ckpt_path`` of ``governed.resume()``; where the script read its hyperparameters, seed and data,
it reads ``run.params``, ``run.seed`` and ``run.data``.

Two more Trainer arguments, marked ``# parcel_hpc (gang)``, let the same script train a trial of
several ranks (``resources.tasks_per_node``, ``resources.nodes``: docs/gangs.md): each rank is a
process parcel_hpc started, to Lightning a node of one device (``num_nodes=run.world_size``), so with
more than one Lightning trains DistributedDataParallel over ``governed.environment()``'s ranks, each
on its share of every batch (the loader's ``rank``/``world_size``).

What makes a preempted trial end with the uninterrupted one's metric: everything is seeded from
``run.seed``, the train loader resumes mid-epoch (``ResumableLoader``), and the callback keeps the
global generators in Lightning's checkpoint beside the model, optimizer, scheduler and loops.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import TensorDataset

from parcel_hpc.integrations.lightning import Governed, ResumableLoader, predictor  # parcel_hpc
from parcel_hpc.trainer import Param, Run, TrainerState, TrainingData, loop  # parcel_hpc


class ParcelNet(L.LightningModule):
    """Two 3x3 convolution blocks, the map's mean and max, a linear head: logits from raw frames
    (n, H, W) in 0..1. The train partition's pixel statistics are buffers, so a saved model serves
    raw frames alone."""

    def __init__(self, lr: float, width: int, pixel_mean: float = 0.0, pixel_std: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean))
        self.register_buffer("pixel_std", torch.tensor(pixel_std))
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.head = nn.Linear(4 * width, 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.features(((frames - self.pixel_mean) / self.pixel_std).unsqueeze(1))
        return self.head(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)).squeeze(1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        frames, labels = batch
        frames = frames + 0.02 * torch.randn_like(frames)  # an augmentation: draws from torch's global generator
        loss = nn.functional.binary_cross_entropy_with_logits(self(frames), labels)
        self.log("train_loss", loss)
        return loss

    def predict_step(self, frames: torch.Tensor, batch_idx: int = 0) -> torch.Tensor:
        return torch.sigmoid(self(frames))

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams["lr"])
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": cosine, "interval": "step"}}


def load(state: TrainerState, params: Mapping[str, Any], seed: int, data: TrainingData) -> Callable[[np.ndarray], np.ndarray]:  # parcel_hpc
    """The served model: built without examples, the weights of the saved Lightning checkpoint, raw frames to probabilities."""
    return predictor(ParcelNet(float(params["lr"]), int(params["width"])), state)  # parcel_hpc


@loop(parameters={"lr": Param(float), "width": Param(int, default=8), "batch_size": Param(int, default=32)}, load=load)  # parcel_hpc
def train(run: Run) -> None:  # parcel_hpc
    L.seed_everything(run.seed, verbose=False)
    frames = torch.tensor(np.asarray(run.data.train.images))
    labels = torch.tensor(np.asarray(run.data.train.labels), dtype=torch.float32)
    model = ParcelNet(float(run.params["lr"]), int(run.params["width"]), frames.mean().item(), frames.std().item())
    batch_size = min(int(run.params["batch_size"]), len(labels))
    loader = ResumableLoader(TensorDataset(frames, labels), batch_size, seed=run.seed, rank=run.rank, world_size=run.world_size)  # parcel_hpc
    governed = Governed(run)  # parcel_hpc
    # The logger writes into a folder of the attempt's own: the launch's preflight runs this loop too
    # and must leave nothing behind. The trial's metrics are recorded by parcel_hpc through the callback.
    with tempfile.TemporaryDirectory(prefix="parcel-lightning-") as logs:
        trainer = L.Trainer(
            max_steps=run.budget.steps,  # parcel_hpc
            max_epochs=-1,  # parcel_hpc
            plugins=[governed.environment()],  # parcel_hpc: parcel_hpc starts and requeues the ranks, not Lightning
            callbacks=[governed],  # parcel_hpc
            devices=1,
            num_nodes=run.world_size,  # parcel_hpc (gang): each of the trial's ranks is one process, on its own device
            use_distributed_sampler=False,  # parcel_hpc (gang): the loader shares each batch between the ranks, resumably
            gradient_clip_val=1.0,
            deterministic=True,
            logger=CSVLogger(logs),
            default_root_dir=logs,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        with governed.resume() as ckpt_path:  # parcel_hpc
            trainer.fit(model, loader, ckpt_path=ckpt_path)  # parcel_hpc (ckpt_path=)
