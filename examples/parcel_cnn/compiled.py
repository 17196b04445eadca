"""The CNN with its training step compiled by ``torch.compile`` (inductor: C++ kernels on the CPU).

Only the training step's forward (and so its backward) is compiled: its batch shape never changes
(``drop_last``), so it compiles once per process; ``serve`` and ``predict`` run the same module
uncompiled, since their batch sizes vary. The state is the module's own (``self.model``), which the
compiled forward shares, so a checkpoint holds the same keys as ``ParcelCNN``'s and a resumed trial
compiles again and continues exactly. Under the final partition's fence the compiler's programs
start and are recorded (docs/faults-and-inputs.md, "The final partition's fence").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from parcel_hpc.trainer import TrainingData

from .trainer import ParcelCNN


class CompiledParcelCNN(ParcelCNN):
    def build(self, params: Mapping[str, Any], seed: int, data: TrainingData) -> None:
        super().build(params, seed, data)
        self.train_forward = torch.compile(self.model, dynamic=False)
