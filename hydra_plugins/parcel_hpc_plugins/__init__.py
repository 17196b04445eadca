"""Hydra plugin for parcel_hpc: the ``parcel`` sweeper. Hydra loads plugins only from the
``hydra_plugins`` namespace; the logic lives in ``parcel_hpc.launch.search``."""
