"""The embedded default: submitit's LocalExecutor, trials as child processes of the launch.

At most ``parallelism`` trials run at once (a laptop has few cores), so the launch must wait: a
local search cannot detach. A job id is the pid of submitit's child process on this host.

GPUs: a job is handed ``resources.gpus`` of this machine's GPUs (``CUDA_VISIBLE_DEVICES`` of the
launch, else what ``nvidia-smi -L`` lists) that no running job of this launch holds, and waits for
them; on a machine with fewer GPUs than a trial asks for, trials run on the CPU and are charged no
GPU-hours (submitit alone would give every job the same first GPUs, or none).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths

from parcel_hpc.errors import UsageError
from parcel_hpc.governance.shape import ShapePlan, TrialShape
from parcel_hpc.gpus import is_index, visible_devices
from parcel_hpc.ledger import SearchDir
from parcel_hpc.probe import pid_alive, runs_submitit
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings, Record, Submitted, Task, job_shape, submitted_of
from parcel_hpc.scheduler.local import EXECUTOR

WAKE_S = 0.02  # how often a waiting launch asks its children whether one ended


class LocalDispatcher(Dispatcher):
    name = EXECUTOR
    can_detach = False

    def __init__(self, settings: LauncherSettings, search: SearchDir, *, max_num_timeout: int) -> None:
        super().__init__(settings)
        self.parallelism = int(settings.params["parallelism"])
        if self.parallelism < 1:
            raise UsageError(f"hydra.launcher.parallelism={self.parallelism} must be >= 1")
        self.folder = job_folder(search)
        self._max_num_timeout = max_num_timeout
        self._executor: submitit.LocalExecutor | None = None
        self.shapes = ShapePlan.of(settings.resources)  # read once: capacity() is asked on every turn of the follow loop
        wanted = self.shapes.largest.gpus  # every rank's, of the largest trial
        self.devices = machine_gpus() if wanted > 0 else ()
        self.on_gpus = len(self.devices) >= wanted  # else CPU only, charged no GPU-hours
        self.held: dict[str, tuple[Any, tuple[int, ...]]] = {}  # job id -> (its Job, the devices it holds)

    @property
    def executor(self) -> submitit.LocalExecutor:
        """Built on first use: LocalExecutor creates its folder, and nothing is written before the search is validated."""
        if self._executor is None:
            self._executor = submitit.LocalExecutor(folder=str(self.folder), max_num_timeout=self._max_num_timeout)
            self._executor.update_parameters(
                timeout_min=int(self.settings.resources["time_limit_min"]),
                signal_delay_s=int(self.settings.params["signal_delay_s"]),
            )
        return self._executor

    def check(self) -> None:
        pass  # this machine is the scheduler

    def gpus_of(self, shape: TrialShape) -> int:
        """The machine's GPUs a job of this shape is handed (every rank's); 0: CPU only."""
        return shape.gpus if self.on_gpus else 0

    def capacity(self) -> int:
        # Counted for the largest trial: a smaller one that would fit is not started ahead of it.
        free = self.parallelism - sum(not job.done() for job, _ in self.held.values())
        per_job = self.gpus_of(self.shapes.largest)
        return min(free, len(self._free_devices()) // per_job) if per_job else free

    def _free_devices(self) -> list[int]:
        busy = {d for job, devices in self.held.values() if not job.done() for d in devices}
        return [d for d in self.devices if d not in busy]

    def slots(self) -> int:
        return self.parallelism

    def submit(self, tasks: Sequence[Task], record: Record, exclude_nodes: Sequence[str] = ()) -> list[Submitted]:
        job_ids = []
        self.executor.python = self.job_python()  # each job holds the search before submitit unpickles it
        for task in tasks:
            shape = job_shape(task, self.settings.resources)
            wanted = self.gpus_of(shape)
            devices = tuple(self._free_devices()[:wanted])
            if len(devices) < wanted:
                raise UsageError(f"no {wanted} free GPUs for another job: submit at most capacity() jobs")
            self.executor.update_parameters(
                timeout_min=task.job_minutes(int(self.settings.resources["time_limit_min"])),
                tasks_per_node=shape.tasks_per_node,  # a gang's ranks: one process each, started together
                gpus_per_node=len(devices),
                visible_gpus=devices,
            )
            job = self.executor.submit(task)
            self.held[str(job.job_id)] = (job, devices)
            job_ids.append(str(job.job_id))
        out = submitted_of(tasks, job_ids)
        record(out)
        return out

    def refresh(self) -> None:
        pass  # submitit's Job objects and /proc answer directly

    def wait(self, seconds: float, at_least: float) -> None:
        started = time.monotonic()
        running = [job for job, _ in self.held.values() if not job.done()]  # before the pause: one ending in it counts
        time.sleep(at_least)
        while running and time.monotonic() - started < seconds:
            if any(job.done() for job in running):
                return  # a child ended: its slot is free now
            time.sleep(WAKE_S)
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))

    def alive(self, trial_id: str, job_id: str) -> bool:
        if job_id in self.held:  # this launch's job (a pack's or a slot's trials share it)
            return not self.held[job_id][0].done()
        return pid_alive(job_id) and runs_submitit(job_id)  # a job of an earlier launch on this machine (not a recycled pid)

    def cancel(self, job_ids: Sequence[str]) -> None:
        # SIGINT, as submitit's own LocalJob.cancel: its controller forwards SIGTERM to the task,
        # whose job environment ignores it once installed, so SIGTERM cancels only a job still starting.
        for job_id in job_ids:
            if pid_alive(job_id) and runs_submitit(job_id):
                os.kill(int(job_id), signal.SIGINT)

    def describe(self, pack_lengths: Sequence[int], slots: bool = False) -> str:
        wanted = self.shapes.largest.gpus
        gpus = (
            f", {'up to ' if self.shapes.mixed else ''}{wanted} of this machine's GPUs {list(self.devices)} each"
            if wanted and self.on_gpus
            else (f", on the CPU: this machine has {len(self.devices)} GPUs, a trial asks for {wanted} (no GPU-hours are charged)" if wanted else "")
        )
        jobs = (
            f"{len(pack_lengths)} slot processes, each taking trials in turn"
            if slots
            else f"{sum(pack_lengths)} trials in {len(pack_lengths)} child processes (up to {max(pack_lengths, default=0)} each, in turn)"
        )
        return f"submitit LocalExecutor: {jobs}, {self.parallelism} at a time{gpus}, folder {self.folder}"


def job_folder(search: SearchDir) -> Path:
    """Where submitit writes a trial job's files (named by the job id, the child's pid)."""
    return search.submitit_dir / "local"


def machine_gpus(env: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The GPUs the launch may hand out: ``CUDA_VISIBLE_DEVICES`` where it is set, else every GPU
    ``nvidia-smi -L`` lists; none on a machine without a driver. Devices named by UUID or MIG id
    are refused: a job's own CUDA_VISIBLE_DEVICES (submitit's) can only number them."""
    env = os.environ if env is None else env
    listing = env.get("CUDA_VISIBLE_DEVICES")
    if listing is not None:
        named = visible_devices(listing)
        if not all(is_index(d) for d in named):
            raise UsageError(
                f"CUDA_VISIBLE_DEVICES={listing} names GPUs by UUID or MIG id; the local executor hands out numbered devices:"
                " give their indices (nvidia-smi -L), or resources.gpus=0"
            )
        return tuple(int(d) for d in named)
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(range(sum(1 for line in out.splitlines() if line.startswith("GPU "))))


def job_logs(search: SearchDir, job_id: str) -> tuple[Path, Path]:
    """A trial job's output and error files (submitit's names, one task a job)."""
    paths = JobPaths(job_folder(search), job_id)
    return paths.stdout, paths.stderr
