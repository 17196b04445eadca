"""A plain PyTorch training loop kept as it is, under parcel_hpc's governance (``trainer.target=parcel_loop:train``;
``parcel_loop:train_compiled`` is the same loop with its training step compiled by ``torch.compile``;
``parcel_loop:train_ddp`` the same loop data-parallel over a trial's ranks, ``resources.tasks_per_node``)."""

from parcel_loop.ddp import train_ddp
from parcel_loop.loop import train, train_compiled

__all__ = ["train", "train_compiled", "train_ddp"]
