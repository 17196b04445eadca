"""Dispatchers: hand worker tasks to submitit, on the local executor or as SLURM array jobs.

Owns the executor split (submitit's Executor/Job roles): what is submitted how, which of our jobs
are alive, and the exact batch script for a dry run. Decides nothing about which trials to run.

- ``LocalDispatcher``: submitit's LocalExecutor; trials are child processes of the launch, at most
  ``parallelism`` at once (a laptop has few cores), so the launch must wait.
- ``SlurmDispatcher``: one ``sbatch --array`` per submission batch, submitted held so the job ids
  are in the ledger before any trial can start, then released.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import slurm
from ..errors import UsageError
from ..worker.task import TrialTask


@dataclass(frozen=True)
class Submitted:
    trial_id: str
    job_id: str


class LocalDispatcher:
    name = "local"
    can_detach = False
    kind = "local"

    def __init__(self, folder: Path, *, parallelism: int, timeout_min: int, signal_delay_s: int, max_num_timeout: int) -> None:
        if parallelism < 1:
            raise UsageError(f"hydra.launcher.parallelism={parallelism} must be >= 1")
        self.parallelism = parallelism
        self.folder = Path(folder)
        self._settings = dict(max_num_timeout=max_num_timeout, timeout_min=timeout_min, signal_delay_s=signal_delay_s)
        self._executor = None
        self.jobs: dict[str, Any] = {}  # trial_id -> submitit Job of this launch

    @property
    def executor(self):
        """Built on first use: LocalExecutor creates its folder, and nothing is written before the search is validated."""
        if self._executor is None:
            import submitit

            s = self._settings
            self._executor = submitit.LocalExecutor(folder=str(self.folder), max_num_timeout=s["max_num_timeout"])
            self._executor.update_parameters(timeout_min=s["timeout_min"], signal_delay_s=s["signal_delay_s"])
        return self._executor

    def capacity(self) -> int:
        return self.parallelism - sum(1 for j in self.jobs.values() if not j.done())

    def submit(self, tasks: Sequence[TrialTask], exclude_nodes: str = "") -> list[Submitted]:
        out = []
        for task in tasks:
            job = self.executor.submit(task)
            self.jobs[task.plan.trial_id] = job
            out.append(Submitted(task.plan.trial_id, str(job.job_id)))
        return out

    def refresh(self) -> None:
        pass

    def alive(self, trial_id: str, job_id: str) -> bool:
        job = self.jobs.get(trial_id)
        if job is not None and str(job.job_id) == job_id:
            return not job.done()
        return _local_pid_alive(job_id)  # a job of an earlier launch on this machine

    def describe(self, n: int) -> str:
        return f"submitit LocalExecutor: {n} trials as child processes, {self.parallelism} at a time, folder {self.folder}"


class SlurmDispatcher:
    name = "slurm"
    can_detach = True
    kind = "slurm"

    def __init__(self, folder: Path, *, job_name: str, resources: Mapping[str, Any], array_parallelism: int,
                 signal_delay_s: int, max_num_timeout: int, setup: Sequence[str] = (), additional: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        self.job_name = job_name
        self.folder = Path(folder)
        self._max_num_timeout = max_num_timeout
        self._executor = None
        extra = {k: v for k, v in dict(additional or {}).items() if v is not None}
        if resources.get("account"):
            extra["account"] = resources["account"]
        if resources.get("qos"):
            extra["qos"] = resources["qos"]
        extra["hold"] = True  # released once the ledger has the job ids
        params = dict(
            job_name=job_name,
            time=int(resources["time_limit_min"]),
            cpus_per_task=int(resources["cpus"]),
            mem=f"{int(float(resources['mem_gb']) * 1024)}M",
            array_parallelism=array_parallelism,
            signal_delay_s=signal_delay_s,
            setup=list(setup),
            additional_parameters=extra,
            wckey=job_name,
        )
        if int(resources["gpus"]) > 0:
            params["gres"] = f"gpu:{int(resources['gpus'])}"
        if resources.get("partition"):
            params["partition"] = resources["partition"]
        self._params = params
        self._queued: dict[str, slurm.QueuedJob] = {}

    @property
    def executor(self):
        """Built after ``check``: submitit's SlurmExecutor raises a bare RuntimeError without srun."""
        if self._executor is None:
            import submitit

            self._executor = submitit.SlurmExecutor(folder=str(self.folder / "%j"), max_num_timeout=self._max_num_timeout)
            self._executor.update_parameters(**self._params)
        return self._executor

    def check(self) -> None:
        slurm.check_reachable(self.env)

    def capacity(self) -> int:
        return 1 << 30  # SLURM queues; the array's %parallelism throttles

    def submit(self, tasks: Sequence[TrialTask], exclude_nodes: str = "") -> list[Submitted]:
        if not tasks:
            return []
        if exclude_nodes:
            self.executor.parameters.setdefault("additional_parameters", {})["exclude"] = exclude_nodes
        try:
            jobs = self.executor.submit_array(list(tasks))
        except Exception as exc:  # submitit wraps sbatch's failure text in a generic error
            first = str(exc).strip().splitlines()
            raise slurm.SchedulerUnavailable(f"sbatch refused the array: {first[-1] if first else exc}; check the partition, account and `sinfo`") from None
        finally:
            self.executor.parameters.get("additional_parameters", {}).pop("exclude", None)
        return [Submitted(t.plan.trial_id, str(j.job_id)) for t, j in zip(tasks, jobs)]

    def release(self, submitted: Sequence[Submitted]) -> None:
        slurm.release(sorted({s.job_id.split("_")[0] for s in submitted}), self.env)

    def refresh(self) -> None:
        self._queued = slurm.queued_jobs(self.job_name, self.env)

    def alive(self, trial_id: str, job_id: str) -> bool:
        return job_id in self._queued

    def describe(self, n: int) -> str:
        from submitit.slurm import slurm as submitit_slurm

        params = dict(self.executor.parameters)
        params["map_count"] = n
        python = shlex.quote(self.executor.python) if " " in self.executor.python else self.executor.python
        command = " ".join([python, "-u -m submitit.core._submit", shlex.quote(str(self.executor.folder))])
        return submitit_slurm._make_sbatch_string(command=command, folder=self.executor.folder, **params)


def make_dispatcher(kind: str, params: Mapping[str, Any], search, resources: Mapping[str, Any], budget: Mapping[str, Any]):
    """A dispatcher from the launcher's settings (also as recorded in a launch, for resubmit)."""
    # submitit's own timeout countdown must never end a trial before parcel_hpc's retry policy does.
    max_num_timeout = int(budget["max_retries"]) + int(budget.get("max_preemptions", 10)) + 1
    settings = {"kind": kind, "params": dict(params), "resources": dict(resources), "budget": dict(budget)}
    if kind == "local":
        d = LocalDispatcher(search.submitit_dir / "local", parallelism=int(params["parallelism"]),
                               timeout_min=int(resources["time_limit_min"]), signal_delay_s=int(params["signal_delay_s"]),
                               max_num_timeout=max_num_timeout)
    elif kind == "slurm":
        d = SlurmDispatcher(search.submitit_dir / "slurm", job_name=str(params["job_name"]), resources=resources,
                               array_parallelism=int(params["array_parallelism"]), signal_delay_s=int(params["signal_delay_s"]),
                               max_num_timeout=max_num_timeout, setup=list(params.get("setup") or []),
                               additional=dict(params.get("additional_parameters") or {}))
    else:
        raise UsageError(f"launcher kind {kind!r} is unknown; use hydra/launcher=submitit_local or submitit_slurm")
    d.settings = settings
    return d


def _local_pid_alive(job_id: str) -> bool:
    try:
        pid = int(job_id)
    except ValueError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False
