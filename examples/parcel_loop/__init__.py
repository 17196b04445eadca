"""A plain PyTorch training loop kept as it is, under parcel_hpc's governance (``trainer.target=parcel_loop:train``)."""

from parcel_loop.loop import train

__all__ = ["train"]
