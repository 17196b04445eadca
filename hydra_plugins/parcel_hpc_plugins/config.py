"""The ``parcel`` sweeper's config node (``parcel_hpc.config.ParcelSweeperConf``), registered in Hydra's ConfigStore.

The launchers (``hydra/launcher=submitit_local|submitit_slurm``) are a plain config group defined in
``parcel_hpc.config``: the sweeper reads them and builds a ``parcel_hpc.scheduler.factory`` dispatcher, so no
Launcher plugin pretends to run arbitrary Hydra jobs.
"""

from hydra.core.config_store import ConfigStore

from parcel_hpc.config import ParcelSweeperConf  # importing it registers parcel_schema and the launcher group

ConfigStore.instance().store(group="hydra/sweeper", name="parcel", node=ParcelSweeperConf, provider="parcel_hpc")
