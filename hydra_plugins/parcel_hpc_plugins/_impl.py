"""The ``parcel`` Hydra sweeper's implementation: turns ``python -m parcel_hpc.launch -m`` into one
governed search. Imported only when Hydra runs the sweeper (``sweeper.py``); Hydra's plugin scan
skips modules whose name starts with ``_``, so it never pays for the launch stack and submitit.

The search space is the ``space`` group with Hydra's sweep grammar on top: ``hydra.sweeper.params``
then sweep overrides on the command line (``lr='tag(log,interval(0.003,0.3))'``), later ones
winning per parameter as in Hydra's own sweepers; ``propose.space`` normalizes all of it into the
one form the contract pins. The ``sampler`` group says how trials are drawn from it. The
``hydra/launcher`` group says where trials
run; the sweeper builds a dispatcher from it (it is a plain config group, not a Launcher plugin:
parcel_hpc dispatches governed trials, not Hydra task-function calls). Errors end the process here
with the project's exit codes (2 bad input, 3 governance refusal) and one line.
"""

from __future__ import annotations

from typing import Any, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from parcel_hpc.errors import exit_on_error
from parcel_hpc.fsio import owner_only_writes
from parcel_hpc.launch.search import SearchLaunch, from_hydra
from parcel_hpc.scheduler.factory import make_dispatcher


class ParcelSweeperImpl:
    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.config: DictConfig | None = None
        self.params = dict(params or {})  # hydra.sweeper.params: parameter -> sweep grammar

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config

    def sweep(self, arguments: list[str]) -> Any:
        owner_only_writes()  # also when a user's own Hydra app runs this sweeper, not our entry point
        with exit_on_error():
            return self._sweep(arguments)

    def _sweep(self, arguments: list[str]) -> Any:
        grammar = [f"{name}={expression}" for name, expression in self.params.items()]
        # parse_overrides sets each override's input_line (None only on an Override built by hand)
        grammar += [cast(str, o.input_line) for o in OverridesParser.create().parse_overrides(arguments) if o.is_sweep_override()]
        assert self.config is not None  # Hydra calls setup() before sweep()
        cfg, settings = from_hydra(self.config, grammar)
        return SearchLaunch(cfg, lambda search: make_dispatcher(settings, search)).run()
