"""The ``parcel`` Hydra sweeper: turns ``python -m parcel_hpc.launch -m`` into one governed search.

Trials come from the pinned search space (``space`` group), not from comma-separated overrides,
so a sweep override on the command line is refused. Errors end the process here with the project's
exit codes (2 bad input, 3 governance refusal) and one line, instead of Hydra's traceback.
"""

from __future__ import annotations

from typing import Any, List

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import DictConfig, OmegaConf


class ParcelSweeper(Sweeper):
    def __init__(self) -> None:
        self.config: DictConfig | None = None
        self.hydra_context = None
        self.task_function = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def sweep(self, arguments: List[str]) -> Any:
        from parcel_hpc.cli_errors import exit_on_error

        with exit_on_error():
            return self._sweep(arguments)

    def _sweep(self, arguments: List[str]) -> Any:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from parcel_hpc.errors import UsageError
        from parcel_hpc.sweep.search import SearchLaunch

        for override in OverridesParser.create().parse_overrides(arguments):
            if override.is_sweep_override():
                raise UsageError(f"sweep override {override.input_line!r}: parcel_hpc samples trials from the pinned space; change the space config group (and search revision) instead")
        launcher = Plugins.instance().instantiate_launcher(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        job_cfg = OmegaConf.masked_copy(self.config, [k for k in self.config if k != "hydra"])
        cfg = OmegaConf.to_container(job_cfg, resolve=True, throw_on_missing=True)
        return SearchLaunch(cfg, lambda search: launcher.dispatcher(search, cfg["resources"], cfg["budget"])).run()
