"""The cluster environment of a governed Trainer: the trial's ranks are processes parcel_hpc started.

A trial of several ranks (a gang, docs/gangs.md) is one process a rank, started by the scheduler
(``srun``, or the local executor) and requeued whole by parcel_hpc. Lightning must neither start
processes nor requeue, and must see each rank as what it is: one process on one device, rank
``run.rank`` of ``run.world_size``. To Lightning every rank is a "node" of one device
(``Trainer(devices=1, num_nodes=run.world_size)``): its local rank is 0, so it takes the first of
the devices the rank was granted, and the global rank Lightning derives (node rank x 1 + 0) is the
trial's. The rendezvous is torch's ``env://``: ``MASTER_ADDR`` and ``MASTER_PORT``, which parcel_hpc
set before the trainer was imported. One rank alone (a trial of one rank, the launch's preflight)
runs on one device, and this environment is then never asked for an address.

Must not: requeue, start a process, or read any variable but torch's rendezvous.
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment


class RanksEnvironment(ClusterEnvironment):
    """Rank ``rank`` of ``world_size`` processes parcel_hpc started: ``Governed(run).environment()``."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not one of a gang of {world_size}")
        self.rank, self.size = rank, world_size

    @property
    def creates_processes_externally(self) -> bool:
        return True  # the scheduler started every rank; Lightning starts none

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ["MASTER_PORT"])  # set for every rank of a gang; a single rank never asks

    @staticmethod
    def detect() -> bool:
        return False  # chosen by passing it, never found

    def world_size(self) -> int:
        return self.size

    def set_world_size(self, size: int) -> None:
        pass  # the trial's, whatever the Trainer's flags make of it: the callback refuses flags that disagree

    def global_rank(self) -> int:
        return self.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # as set_world_size: the trial's rank (the strategy then sets rank_zero_only's from global_rank())

    def local_rank(self) -> int:
        return 0  # each rank's devices are its own: the first of them is its device

    def node_rank(self) -> int:
        return self.rank
