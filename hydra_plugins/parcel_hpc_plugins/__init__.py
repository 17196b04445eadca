"""Hydra plugins for parcel_hpc: the ``parcel`` sweeper and the ``submitit_local`` / ``submitit_slurm``
launchers. Hydra loads plugins only from the ``hydra_plugins`` namespace; the logic lives in
``parcel_hpc.sweep`` and is imported lazily."""
