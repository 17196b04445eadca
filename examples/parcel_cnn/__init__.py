"""The second example of bringing your own model: a small convolutional network in PyTorch, trained
on the snapshot's raw 32x32 frames (not the pinned preprocessing's pooled features).

Run a search with it from the repository root (``pip install parcel_hpc[torch]`` first)::

    PYTHONPATH=examples python -m parcel_hpc.launch -m trainer.target=parcel_cnn:ParcelCNN \\
        --config-dir examples/parcel_cnn/conf space=cnn_r1 selection/baseline=cnn_approved

Its space (``conf/space/cnn_r1.yaml``) searches the learning rate on a log scale, the width and
depth of the network, dropout, the batch size and the optimizer; ``conf/selection/baseline/``
holds the approved CNN it is gated against.
"""

from .compiled import CompiledParcelCNN
from .trainer import ParcelCNN, ParcelNet

__all__ = ["CompiledParcelCNN", "ParcelCNN", "ParcelNet"]
