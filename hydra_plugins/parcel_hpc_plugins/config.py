"""Config dataclasses for the sweeper and launchers, registered in Hydra's ConfigStore.

The launcher names follow hydra-submitit-launcher (``hydra/launcher=submitit_local`` and
``submitit_slurm``) so its users feel at home; do not install both (their names would clash).
"""


from dataclasses import dataclass, field
from typing import Any, Dict, List

from hydra.core.config_store import ConfigStore

import parcel_hpc.config  # noqa: F401  registers parcel_schema


@dataclass
class ParcelSweeperConf:
    _target_: str = "hydra_plugins.parcel_hpc_plugins.sweeper.ParcelSweeper"


@dataclass
class SubmititLocalConf:
    _target_: str = "hydra_plugins.parcel_hpc_plugins.launcher.LocalLauncher"
    submitit_folder: str = "${search.root}/${search.revision}/submitit/local"
    parallelism: int = 2  # trials at once (processes)
    signal_delay_s: int = 30  # seconds before the time limit that the worker is told to checkpoint


@dataclass
class SubmititSlurmConf:
    _target_: str = "hydra_plugins.parcel_hpc_plugins.launcher.SlurmLauncher"
    submitit_folder: str = "${search.root}/${search.revision}/submitit/slurm"
    job_name: str = "parcel-${search.revision}"  # sacct/squeue find the search's jobs by this name
    array_parallelism: int = 16  # array tasks running at once (sbatch --array=...%N)
    signal_delay_s: int = 60  # seconds before the time limit that SIGUSR2 arrives
    setup: List[str] = field(default_factory=list)  # shell lines run before the worker (module load, ...)
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # extra sbatch options


ConfigStore.instance().store(group="hydra/sweeper", name="parcel", node=ParcelSweeperConf, provider="parcel_hpc")
ConfigStore.instance().store(group="hydra/launcher", name="submitit_local", node=SubmititLocalConf, provider="parcel_hpc")
ConfigStore.instance().store(group="hydra/launcher", name="submitit_slurm", node=SubmititSlurmConf, provider="parcel_hpc")
