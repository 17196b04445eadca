"""The ``parcel`` sweeper's config node, registered in Hydra's ConfigStore.

The launchers (``hydra/launcher=submitit_local|submitit_slurm``) are a plain config group defined in
``parcel_hpc.config``: the sweeper reads them and builds a ``parcel_hpc.scheduler.factory`` dispatcher, so no
Launcher plugin pretends to run arbitrary Hydra jobs.
"""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

import parcel_hpc.config  # noqa: F401  registers parcel_schema and the launcher group


@dataclass
class ParcelSweeperConf:
    _target_: str = "hydra_plugins.parcel_hpc_plugins.sweeper.ParcelSweeper"
    # Parameter -> Hydra sweep grammar (``tag(log, interval(0.003, 0.3))``), as Hydra 1.2+ sweepers take it.
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="parcel", node=ParcelSweeperConf, provider="parcel_hpc")
