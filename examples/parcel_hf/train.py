"""A Hugging Face ``Trainer`` on the raw parcel frames, kept as its author wrote it: a tiny ResNet built
from its config (nothing downloaded), ``TrainingArguments``, ``Trainer.train``. The lines parcel_hpc
asks for are marked ``# parcel_hpc`` (docs/bring-your-own-model.md, "Keep your Hugging Face Trainer"):
the imports, the serving ``load``, the decorator, the trial's length, seed and save strategy in the
arguments, the callback and its ``compute_metrics``, the resume lines (15 lines); the datasets are
built from ``run.data``'s arrays. The Trainer restores its own optimizer, scheduler, RNGs and data order on resume.
The same script trains a trial of several ranks (``resources.tasks_per_node=2``) as the Trainer's own DDP:
the ``TrainingArguments`` built here read each rank's ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import ResNetConfig, ResNetForImageClassification, Trainer, TrainingArguments, set_seed

from parcel_hpc.integrations.huggingface import Governed, resume_from, saved_checkpoint  # parcel_hpc
from parcel_hpc.trainer import Param, Run, TrainerState, TrainingData, loop  # parcel_hpc


class Frames(Dataset):
    """Raw frames (n, H, W) in 0..1 as one-channel pixel values, with their labels."""

    def __init__(self, frames: np.ndarray, labels: np.ndarray) -> None:
        self.pixels = torch.tensor(np.asarray(frames, dtype=np.float32)).unsqueeze(1)
        self.labels = torch.tensor(np.asarray(labels), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixels[i], "labels": self.labels[i]}


def model(width: int) -> ResNetForImageClassification:
    config = ResNetConfig(num_channels=1, embedding_size=width, hidden_sizes=[width, 2 * width], depths=[1, 1], layer_type="basic", num_labels=2)
    return ResNetForImageClassification(config)


def probabilities(net: ResNetForImageClassification, frames: np.ndarray) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        logits = net(pixel_values=torch.tensor(np.asarray(frames, dtype=np.float32)).unsqueeze(1)).logits
    return torch.softmax(logits.double(), dim=1)[:, 1].numpy()


def load(state: TrainerState, params: Mapping[str, Any], seed: int, data: TrainingData) -> Callable[[np.ndarray], np.ndarray]:  # parcel_hpc
    """The served model: the Trainer's own checkpoint from the saved state, raw frames to probabilities."""
    with saved_checkpoint(state) as checkpoint:  # parcel_hpc
        net = ResNetForImageClassification.from_pretrained(checkpoint)  # parcel_hpc
    return lambda frames: probabilities(net, frames)  # parcel_hpc


@loop(parameters={"lr": Param(float), "width": Param(int, default=16), "batch_size": Param(int, default=32)}, load=load)  # parcel_hpc
def train(run: Run) -> None:
    set_seed(run.seed)
    governed = Governed(run)  # parcel_hpc
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir,
            max_steps=run.budget.steps,  # parcel_hpc: the trial's length, so the cosine schedule is the trial's
            seed=run.seed,  # parcel_hpc
            save_strategy="no",  # parcel_hpc: the run says when to save
            per_device_train_batch_size=int(run.params["batch_size"]),
            per_device_eval_batch_size=256,
            learning_rate=float(run.params["lr"]),
            lr_scheduler_type="cosine",
            logging_steps=50,
            report_to="none",
            disable_tqdm=True,
            use_cpu=not run.data.devices.visible,
        )
        trainer = Trainer(
            model=model(int(run.params["width"])),
            args=args,
            train_dataset=Frames(run.data.train.images, run.data.train.labels),
            eval_dataset=Frames(run.data.validation.images, run.data.validation.labels),
            callbacks=[governed],  # parcel_hpc
            compute_metrics=governed.compute_metrics,  # parcel_hpc
        )
        with resume_from(run) as checkpoint:  # parcel_hpc
            trainer.train(resume_from_checkpoint=checkpoint)  # parcel_hpc
