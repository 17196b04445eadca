"""An unchanged Hugging Face ``Trainer`` under parcel_hpc's governance (``trainer.target=parcel_hf:train``)."""

from parcel_hf.train import train

__all__ = ["train"]
