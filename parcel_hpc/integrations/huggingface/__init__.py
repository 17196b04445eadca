"""Hugging Face ``transformers.Trainer`` kept unchanged under the governance (docs/bring-your-own-model.md).

The optional extra ``hf``; only this package imports transformers (the core never does).
"""

from parcel_hpc.integrations.huggingface.governed import Governed, UngovernableArguments, resume_from, saved_checkpoint

__all__ = ["Governed", "UngovernableArguments", "resume_from", "saved_checkpoint"]
