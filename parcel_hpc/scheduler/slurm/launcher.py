"""The ``hydra/launcher=submitit_slurm`` group: its schema (trials as SLURM array jobs) and its
checks (``check``: the job name, the setup lines, the sbatch options a user may add).

A plain config group the parcel sweeper reads (no Launcher plugin behind it), registered by the
registry (``registry.register_launchers``) under the backend's ``launcher_name``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parcel_hpc.governance.validation import bad, name, text
from parcel_hpc.scheduler.slurm import EXECUTOR

MAX_JOB_NAME = 80  # a search's job name (the default is parcel-<revision>); the scheduler adds "-<search id>"
_OPTION_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")
_OPTION_VALUE_RE = re.compile(r"[A-Za-z0-9._/+,@=%:|&\[\]*-]+")
# sbatch options parcel_hpc sets itself: a search's identity, its hold-until-recorded, its logs.
RESERVED_OPTIONS = frozenset(
    {"job-name", "comment", "wckey", "hold", "array", "output", "error", "signal", "requeue", "exclude", "open-mode"}
    | {"time", "mem", "cpus-per-task", "gres", "gpus", "partition", "account", "qos"}
    # Also pinned resources in another spelling: they would slip past the contract and the budget.
    | {"ntasks", "ntasks-per-node", "nodes", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "mem-per-cpu", "mem-per-gpu", "cpus-per-gpu"}
    # ... and what else makes an allocation larger than the contract's: TRES, whole nodes, CPU minimums, layouts.
    | {"tres-per-task", "tres-per-job", "exclusive", "mincpus", "ntasks-per-core", "ntasks-per-socket", "ntasks-per-gpu"}
    | {"sockets-per-node", "cores-per-socket", "threads-per-core", "extra-node-info", "time-min"}
)


@dataclass
class SubmititSlurmConf:
    """``hydra/launcher=submitit_slurm``: trials as SLURM array jobs."""

    kind: str = str(EXECUTOR)  # the backend it runs on
    job_name: str = "parcel-${search.revision}"  # jobs are named <job_name>-<search id>: only this search's
    array_parallelism: int = 16  # array tasks running at once (sbatch --array=...%N)
    signal_delay_s: int = 60  # seconds before the time limit that SIGUSR2 arrives
    pack_size: Any = "auto"  # trials one array task runs in turn: auto (docs/slurm-and-accounting.md, packed trials) or 1, 2, ...
    pack_minutes: float = 60.0  # auto: about this much expected work per packed task
    dispatch: str = (
        "auto"  # jobs: each array task is handed its trials; slots: each takes the next trial (and proposal) when free; auto: slots where the sampler learns
    )
    check_account_limits: bool = True  # refuse (hold:budget) a launch whose worst case the account's SLURM association limits cannot hold
    setup: list[str] = field(default_factory=list)  # shell lines run before the worker (module load, ...)
    additional_parameters: dict[str, Any] = field(default_factory=dict)  # extra sbatch options


def check(launcher: Mapping[str, Any]) -> None:
    """The launcher group's SLURM values, checked before anything is written (UsageError, one line)."""
    name("hydra.launcher.job_name", launcher["job_name"], max_len=MAX_JOB_NAME)
    for i, line in enumerate(launcher.get("setup") or []):
        text(f"hydra.launcher.setup[{i}]", line)  # shell by design (module load, source ...): one line each
    for option, value in (launcher.get("additional_parameters") or {}).items():
        key = f"hydra.launcher.additional_parameters.{option}"
        if not _OPTION_RE.fullmatch(str(option)):
            raise bad(key, option, "is not an sbatch option name", "use the long option without dashes, like constraint or mail_type")
        if option.replace("_", "-") in RESERVED_OPTIONS:
            raise bad(key, value, "is set by parcel_hpc itself (search identity, hold, logs or limits)", "remove it; limits go in the resources group")
        if value is None or value is True:
            continue  # None: not passed; True: a flag such as --exclusive
        if isinstance(value, bool):
            raise bad(key, value, "is false", "remove the option instead")
        if isinstance(value, int):
            continue
        _option_value(key, value)


def _option_value(key: str, value: object, max_len: int = 200) -> str:
    """A value that goes into an #SBATCH line as it is (never through a shell)."""
    value = text(key, value, max_len)
    if not _OPTION_VALUE_RE.fullmatch(value):
        raise bad(key, value, "is not safe in an #SBATCH line", "use letters, digits and . _ / + , @ = % : | & [ ] * - only")
    return value
