"""The ``parcel`` sweeper's config node (``parcel_hpc.config.ParcelSweeperConf``) and the launcher
groups, registered in Hydra's ConfigStore when Hydra scans its plugins (every composition).

The launchers (``hydra/launcher=submitit_local|submitit_slurm``) are a plain config group, each
declared by its scheduler backend (``Backend.launcher``) and registered by
``parcel_hpc.scheduler.registry``: the sweeper reads them and builds a ``parcel_hpc.scheduler.factory``
dispatcher, so no Launcher plugin pretends to run arbitrary Hydra jobs.
"""

from hydra.core.config_store import ConfigStore

from parcel_hpc.config import ParcelSweeperConf  # importing it registers parcel_schema
from parcel_hpc.scheduler.registry import register_launchers

ConfigStore.instance().store(group="hydra/sweeper", name="parcel", node=ParcelSweeperConf, provider="parcel_hpc")
register_launchers()
