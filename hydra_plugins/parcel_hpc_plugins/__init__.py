"""Hydra plugin for parcel_hpc: the ``parcel`` sweeper. Hydra loads plugins only from the
``hydra_plugins`` namespace. ``sweeper.py`` is the thin class Hydra finds, ``config.py`` its config
node, ``_impl.py`` the logic (imported lazily); the search itself is ``parcel_hpc.launch.search``'s."""
