"""A Lightning model trained by an unchanged ``Trainer.fit``, under parcel_hpc's governance
(``trainer.target=parcel_lightning:train``; ``pip install -c constraints lightning`` beside the CPU torch)."""

from parcel_lightning.model import train

__all__ = ["train"]
