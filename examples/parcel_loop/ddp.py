"""The same plain PyTorch loop, data-parallel over the ranks of one trial (``resources.tasks_per_node``
ranks, each a process): ``trainer.target=parcel_loop:train_ddp``. What changes from ``loop.py`` is what
any DistributedDataParallel script changes, and nothing of parcel_hpc's: the process group (torch reads
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which parcel_hpc set before this module was imported),
the model wrapped, and each rank training on its share of every batch. The ``# parcel_hpc`` lines are
loop.py's: every rank tells its run of each step, saves and validates when told, and returns when
told; rank 0's decisions are the gang's, each rank's state is its part of one checkpoint.

One rank (the launch's preflight, a search of one rank per trial) runs it as loop.py does.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parcel_hpc.trainer import Run, loop
from parcel_hpc.trainer import torch as parcel_torch
from parcel_loop.loop import PARAMETERS, Net, load, probabilities


@loop(parameters=PARAMETERS, load=load)  # parcel_hpc
def train_ddp(run: Run) -> None:
    world, rank = run.world_size, run.rank  # the trial's gang (what torch.distributed reads from the environment)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")  # "nccl" on GPUs
    parcel_torch.deterministic()
    parcel_torch.seed_everything(run.seed)
    frames = torch.tensor(np.asarray(run.data.train.images))
    labels = torch.tensor(np.asarray(run.data.train.labels), dtype=torch.float32)
    model = Net(int(run.params["width"]), frames.mean().item(), frames.std().item())
    forward = DistributedDataParallel(model) if world > 1 else model  # averages the ranks' gradients
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(run.params["lr"]))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=run.budget.steps)
    stateful = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
    batch_size = min(int(run.params["batch_size"]), len(labels)) // world * world  # an equal share for each rank
    per_epoch = len(labels) // batch_size

    def share(step: int) -> torch.Tensor:
        """This rank's share of the step's batch: the batch is a function of the seed and the step alone."""
        epoch, i = divmod(step - 1, per_epoch)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(run.seed * 100_003 + epoch))
        return order[i * batch_size : (i + 1) * batch_size][rank::world]

    start = 0
    if (saved := run.restore()) is not None:  # parcel_hpc
        start = parcel_torch.unpack(saved.state, stateful)  # parcel_hpc
    for step in range(start + 1, run.budget.steps + 1):
        idx = share(step)
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
