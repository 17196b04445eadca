"""A train loader Lightning can resume mid-epoch: the batches an epoch still owes, in the order it drew.

A plain ``DataLoader(shuffle=True)`` is not stateful: Lightning restarts an interrupted epoch from its
first batch (with a warning only) and a resumed trial trains on other batches than the uninterrupted
one. ``ResumableLoader`` is a ``DataLoader`` whose batch sampler shuffles with a generator of its
own (seeded from the trial's seed, never the global one) and whose ``state_dict`` is that generator
at the epoch's start and the batches yielded since: Lightning saves it and
hands it back and the epoch goes on where it stopped. Skipped batches are never loaded.

In a trial of several ranks (``rank``, ``world_size``: the run's) every rank draws the same batches
and takes its share of each (``batch[rank::world_size]``), as the function form's DistributedDataParallel
loop does: ``batch_size`` is the gang's batch, so a hyperparameter means the same at every shape, and
each rank's state is its own part of the trial's checkpoint. Lightning's own distributed sampler
(``use_distributed_sampler``) would replace this order with one that cannot resume mid-epoch.

Must not: draw from a process-wide generator; know anything of parcel_hpc's runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

_SEED_STRIDE = 1_000_003  # the loader's worker base seed is drawn from a generator apart from the order's


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices, shuffled (or not) by its own generator; its state: where the epoch is.

    The epoch's order is drawn when its first batch is asked for (a generator body runs lazily), so a
    state loaded after Lightning already called ``iter()`` still applies."""

    def __init__(self, n: int, batch_size: int, seed: int, shuffle: bool = True, drop_last: bool = False, rank: int = 0, world_size: int = 1) -> None:
        if n < 1 or batch_size < 1:
            raise ValueError(f"ResumableLoader needs examples and a positive batch size, got {n} examples and batch_size={batch_size}")
        if not 0 <= rank < world_size or batch_size < world_size:
            raise ValueError(f"ResumableLoader(rank={rank}, world_size={world_size}, batch_size={batch_size}): every rank needs a share of each batch")
        self.n, self.batch_size, self.shuffle, self.drop_last = n, batch_size, shuffle, drop_last
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self._epoch_start = self.generator.get_state()
        self._yielded = 0
        self._pending: tuple[torch.Tensor, int] | None = None

    def __len__(self) -> int:
        # A last short batch is kept only where every rank has a share of it (an empty share has no loss).
        whole, rest = divmod(self.n, self.batch_size)
        return whole + (0 < rest and not self.drop_last and rest >= self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        skip = 0
        if self._pending is not None:
            state, skip = self._pending
            self.generator.set_state(state)
            self._pending = None
        self._epoch_start = self.generator.get_state()
        order = torch.randperm(self.n, generator=self.generator).tolist() if self.shuffle else list(range(self.n))
        batches = [order[i : i + self.batch_size] for i in range(0, len(self) * self.batch_size, self.batch_size)]
        self._yielded = skip
        for batch in batches[skip:]:
            self._yielded += 1
            yield batch[self.rank :: self.world_size]
        self._yielded = 0

    def state_dict(self) -> dict[str, Any]:
        if self._yielded in (0, len(self)):  # between epochs: the next one starts from the generator as it is
            return {"generator": self.generator.get_state(), "skip": 0}
        return {"generator": self._epoch_start, "skip": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["skip"]) == 0:
            self.generator.set_state(state["generator"])
        else:
            self._pending = (state["generator"], int(state["skip"]))


class ResumableLoader(DataLoader):
    """``DataLoader(dataset, batch_size, shuffle=...)`` that resumes mid-epoch: ``ResumableLoader(dataset,
    batch_size, seed=run.seed, rank=run.rank, world_size=run.world_size)``. Any other ``DataLoader``
    argument (``num_workers``, ``collate_fn``) passes through."""

    def __init__(
        self, dataset: Dataset, batch_size: int, seed: int, *, shuffle: bool = True, drop_last: bool = False, rank: int = 0, world_size: int = 1, **kwargs: Any
    ) -> None:
        sampler = ResumableBatchSampler(len(dataset), batch_size, seed, shuffle, drop_last, rank, world_size)  # type: ignore[arg-type]  # a map-style dataset
        super().__init__(dataset, batch_sampler=sampler, generator=torch.Generator().manual_seed(seed * _SEED_STRIDE + 1), **kwargs)

    @property
    def shares(self) -> tuple[int, int]:
        """This loader's rank and the ranks its batches are shared between."""
        sampler: ResumableBatchSampler = self.batch_sampler  # type: ignore[assignment]  # always the sampler above
        return sampler.rank, sampler.world_size

    def state_dict(self) -> dict[str, Any]:
        return self.batch_sampler.state_dict()  # type: ignore[union-attr]  # always the sampler above

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batch_sampler.load_state_dict(state)  # type: ignore[union-attr]
