"""Milestone pruning: a pure stop rule, and the shared-directory store that feeds it and records it.

Owns when a trial may be stopped early, and the on-disk record of every value and decision that
went into it. Must not train, read the ledger or decide which trials are quarantined; the worker
calls ``report`` then ``decide`` at each milestone, and the ledger calls ``invalidate_uses_of``.

    store = MilestoneStore(search_dir, milestones=(10, 20, 41, 82))
    pruner = AsyncSuccessiveHalving(store.milestones, reduction_factor=3, min_peers=4)
    if store.report(trial_id, step, miss_cost, attempt):
        if store.decide(pruner, trial_id, step, exclude=quarantined).action.stops_trial:
            ...  # record the trial as pruned and stop

A K-fold trial reports each fold run's milestones to that fold's store (``store.of_fold(f)``) the
mean over its folds so far (``value_over_folds``). The rule (ties included) is in ``_rule``; the concurrency guarantees are in ``_store``.
"""

from parcel_hpc.errors import UsageError
from parcel_hpc.pruning._rule import AsyncSuccessiveHalving, NopPruner, PruneAction, PruneDecision, Pruner, value_over_folds
from parcel_hpc.pruning._store import Invalidation, MilestoneReport, MilestoneStore, RecordedDecision


def make_pruner(cfg) -> Pruner:
    """The pruner named by the ``pruner`` config group (``kind: asha`` or ``kind: none``)."""
    milestones = tuple(int(m) for m in cfg["milestones"])
    if cfg["kind"] == "asha":
        return AsyncSuccessiveHalving(milestones, reduction_factor=int(cfg["reduction_factor"]), min_peers=int(cfg["min_peers"]))
    if cfg["kind"] == "none":
        return NopPruner(milestones)
    raise UsageError(f"pruner.kind={cfg['kind']!r} is unknown; use pruner=asha_r1 or pruner=none")


__all__ = [
    "make_pruner",
    "AsyncSuccessiveHalving",
    "Invalidation",
    "MilestoneReport",
    "MilestoneStore",
    "NopPruner",
    "PruneAction",
    "PruneDecision",
    "Pruner",
    "RecordedDecision",
    "value_over_folds",
]
