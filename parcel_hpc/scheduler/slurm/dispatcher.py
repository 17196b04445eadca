"""SLURM arrays through submitit: ``sbatch --array`` per submission batch, split where the
controller would refuse it.

Each array is submitted held, its job ids recorded in the ledger, then released, so accounting can
find jobs that never ran. A batch larger than the controller's MaxArraySize becomes several arrays,
and no more jobs are submitted than its MaxJobCount leaves room for (both read from the controller).
GPU/CPU/memory/time limits, the USR2 warning and requeue come from the launcher settings and the
frozen resources; a packed task's time limit is its trials' added up.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths
from submitit.slurm import slurm as submitit_slurm

from parcel_hpc import anchor
from parcel_hpc.budget import AssociationLimit
from parcel_hpc.errors import ReleaseFailed, SchedulerUnavailable
from parcel_hpc.governance.shape import ShapePlan, TrialShape
from parcel_hpc.identity import SearchIdentity, scheduler_name
from parcel_hpc.ledger import SearchDir
from parcel_hpc.ownership import current_user
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings, QueuedJob, QueueState, Record, Submitted, Task, job_shape, submitted_of
from parcel_hpc.scheduler.packing import job_time_limit_min
from parcel_hpc.scheduler.slurm import EXECUTOR, calls
from parcel_hpc.scheduler.slurm import queue as slurm


class SlurmDispatcher(Dispatcher):
    name = EXECUTOR
    can_detach = True

    def __init__(self, settings: LauncherSettings, search: SearchDir, *, max_num_timeout: int, env: Mapping[str, str]) -> None:
        super().__init__(settings)
        self.env = dict(env)
        self.search = search
        self._max_num_timeout = max_num_timeout
        self._executor: submitit.SlurmExecutor | None = None
        self._queued: dict[str, QueuedJob] = {}
        self._limits: slurm.ControllerLimits | None = None
        self._max_job_minutes: tuple[float | None] | None = None

    @property
    def limits(self) -> slurm.ControllerLimits:
        if self._limits is None:
            self._limits = slurm.controller_limits(self.env)
        return self._limits

    @property
    def job_name(self) -> str:
        """The scheduler name of this search's trial jobs: the launcher's job_name and the search id
        (read when first needed: a launch makes the dispatcher before its contract froze)."""
        return scheduler_name(str(self.settings.params["job_name"]), self.search.identity())

    @property
    def executor(self) -> submitit.SlurmExecutor:
        """Built after ``check``: submitit's SlurmExecutor raises a bare RuntimeError without srun."""
        if self._executor is None:
            self._executor = submitit.SlurmExecutor(folder=str(job_folder(self.search)), max_num_timeout=self._max_num_timeout)
            identity = self.search.identity()
            revision = self.search.contract()["search_revision"] if identity is not None else ""
            self._executor.update_parameters(**sbatch_parameters(self.settings, identity, revision))
        return self._executor

    def launch_record(self) -> dict:
        return {**super().launch_record(), "scheduler_job_name": self.job_name}

    def check(self) -> None:
        slurm.check_reachable(self.env)

    def account_limits(self) -> tuple[str, list[AssociationLimit]] | None:
        if not self.settings.params.get("check_account_limits", True) or not self.limits.accounting:
            return None  # turned off, or a cluster without accounting: no association, no limit
        try:
            resources = self.settings.resources
            return slurm.account_limits(
                str(resources.get("account") or ""), current_user(), self.limits.cluster, str(resources.get("partition") or ""), self.env
            )
        except SchedulerUnavailable as exc:
            raise SchedulerUnavailable(
                f"cannot read the account's association limits ({exc}); fix that, or launch without this check: hydra.launcher.check_account_limits=false"
            ) from None

    def capacity(self) -> int:
        # SLURM queues (the array's %parallelism throttles); only the controller's MaxJobCount bounds
        # what it holds. Other users' jobs count too: sbatch refusing is then a resumable failure.
        return max(0, self.limits.max_job_count - len(self._queued))

    def slots(self) -> int:
        return int(self.settings.params["array_parallelism"])

    def max_job_minutes(self) -> float | None:
        if self._max_job_minutes is None:
            self._max_job_minutes = (slurm.max_job_minutes(self.settings.resources.get("partition"), self.env),)
        return self._max_job_minutes[0]

    def submit(self, tasks: Sequence[Task], record: Record, exclude_nodes: Sequence[str] = ()) -> list[Submitted]:
        out: list[Submitted] = []
        size = self.limits.max_array_size
        parallelism = self.slots()
        # An array's tasks share one --nodes, --ntasks-per-node and --gres: one array (or more) per trial shape.
        by_shape: dict[TrialShape, list[Task]] = {}
        for task in tasks:
            by_shape.setdefault(job_shape(task, self.settings.resources), []).append(task)
        chunks = [(shape, group[start : start + size]) for shape, group in by_shape.items() for start in range(0, len(group), size)]
        for shape, chunk in chunks:
            # Several arrays share the launcher's array_parallelism, in proportion to their tasks.
            share = max(1, round(parallelism * len(chunk) / len(tasks))) if len(chunks) > 1 else parallelism
            out += self._submit_array(chunk, record, exclude_nodes, share, shape)
        return out

    def _submit_array(self, tasks: Sequence[Task], record: Record, exclude_nodes: Sequence[str], parallelism: int, shape: TrialShape) -> list[Submitted]:
        params = self.executor.parameters
        params["array_parallelism"] = parallelism
        launch_shape = {k: params.pop(k) for k in SHAPE_PARAMETERS if k in params}
        params.update(shape_parameters(shape))
        extra = params.setdefault("additional_parameters", {})
        if exclude_nodes:
            extra["exclude"] = ",".join(exclude_nodes)
        limit = int(self.settings.resources["time_limit_min"])
        params["time"] = max(t.job_minutes(limit) for t in tasks)
        for task in tasks:
            if params["time"] > task.job_minutes(limit):
                task.own_limits = True  # a shorter task in an array of longer packs: the scheduler warns too late for it
        self.executor.python = self.job_python()  # each job holds the search before submitit unpickles it
        try:
            calls.count("sbatch")  # submitit runs it
            jobs = self.executor.submit_array(list(tasks))
        except Exception as exc:  # submitit wraps sbatch's failure text in a generic error
            first = str(exc).strip().splitlines()
            raise SchedulerUnavailable(f"sbatch refused the array: {first[-1] if first else exc}; check the partition, account and `sinfo`") from None
        finally:
            extra.pop("exclude", None)
            params["time"] = limit
            params["array_parallelism"] = self.slots()
            for k in SHAPE_PARAMETERS:
                params.pop(k, None)
            params.update(launch_shape)
        submitted = submitted_of(tasks, [str(j.job_id) for j in jobs])
        record(submitted)  # held until here: the ledger knows every job id before any can start
        try:
            slurm.release(sorted({s.job_id.split("_")[0] for s in submitted}), self.env)
        except SchedulerUnavailable as exc:
            raise ReleaseFailed(f"{exc}; the jobs are submitted and recorded but held: rerun the same launch to release them") from None
        return submitted

    def refresh(self) -> None:
        self._queued = slurm.search_jobs(self.search, self.env, also=[self.job_name])

    def recover(self, known_jobs: set[str]) -> list[str]:
        # Only jobs the ledger knows: a held array it does not know yet may be another launcher's,
        # between its sbatch and its records (released by that launcher; reconcile shows it otherwise).
        held = [j for j, q in self._queued.items() if q.state is QueueState.PENDING and q.reason == "JobHeldUser" and j in known_jobs]
        release = sorted({j.split("_")[0] for j in held})
        slurm.release(release, self.env)
        return release

    def alive(self, trial_id: str, job_id: str) -> bool:
        return job_id in self._queued

    def wait(self, seconds: float, at_least: float) -> None:
        time.sleep(max(seconds, calls.MIN_ROUND_S))  # each round asks squeue: bounded whatever the number of jobs

    def scheduler_calls(self) -> dict[str, int]:
        return dict(calls.CALLS)

    def cancel(self, job_ids: Sequence[str]) -> None:
        slurm.cancel(job_ids, self.env)

    def describe(self, pack_lengths: Sequence[int], slots: bool = False) -> str:
        params = dict(self.executor.parameters)
        params["map_count"] = min(len(pack_lengths), self.limits.max_array_size)
        params["time"] = job_time_limit_min(max(pack_lengths, default=1), int(self.settings.resources["time_limit_min"]))
        # The search's identity is known once its directory exists (a dry run of a new search: placeholders).
        python = (
            anchor.job_command(self.owned)
            if self.owned is not None
            else f"{shlex.quote(sys.executable)} -P -u -m {anchor.GATE_MODULE} SEARCH_DIR UID INODE SEARCH_ID"
        )
        command = " ".join([python, *anchor.SUBMITIT_ENTRY, shlex.quote(str(self.executor.folder))])
        script = submitit_batch_script(command, self.executor.folder, params)
        if self.search.identity() is None:
            script = f"# job name and comment gain this search's id (-<12 hex digits>) when its contract freezes\n{script}"
        if slots:
            script = f"# {len(pack_lengths)} slots: array tasks that each take trials in turn while --time lasts (room for {max(pack_lengths, default=1)} at the limit)\n{script}"
        elif max(pack_lengths, default=1) > 1:
            script = f"# {sum(pack_lengths)} trials in {len(pack_lengths)} array tasks, up to {max(pack_lengths)} each in turn\n{script}"
        arrays = -(-len(pack_lengths) // self.limits.max_array_size)
        if arrays > 1:
            script = f"# {len(pack_lengths)} tasks: {arrays} arrays of at most MaxArraySize={self.limits.max_array_size}; the first:\n{script}"
        plan = ShapePlan.of(self.settings.resources)
        if plan.mixed:
            shapes = ", ".join(shape.describe() for shape in plan.all_shapes())
            script = f"# trials of {len(plan.all_shapes())} shapes ({shapes}): an array per shape, each with its own --nodes, --ntasks-per-node and --gres; the default shape's:\n{script}"
        return script


def job_folder(search: SearchDir) -> Path:
    """Where submitit writes a trial job's files: a folder per job (``%j``: its id, ``123_4`` for an array task)."""
    return search.submitit_dir / "slurm" / "%j"


def submitit_batch_script(command: str, folder: Path, params: Mapping[str, Any]) -> str:
    """The batch script submitit would write. submitit has no public API for it: this is the one
    use of a private function (``tests/test_dispatch.py`` fails loudly if submitit changes it)."""
    return submitit_slurm._make_sbatch_string(command=command, folder=folder, **params)


def sbatch_parameters(settings: LauncherSettings, identity: SearchIdentity | None = None, search_revision: str = "") -> dict[str, Any]:
    """submitit's SlurmExecutor parameters from the launcher settings, the pinned resources and the
    search's identity (its job name, comment and wckey; None only for a search frozen before ids)."""
    params, resources = settings.params, settings.resources
    extra = {k: v for k, v in dict(params.get("additional_parameters") or {}).items() if v is not None}
    for key in ("account", "qos"):
        if resources.get(key):
            extra[key] = resources[key]
    extra["hold"] = True  # released once the ledger has the job ids
    if identity is not None:
        extra["comment"] = identity.comment(search_revision)
    name = scheduler_name(str(params["job_name"]), identity)
    out = dict(
        job_name=name,
        time=int(resources["time_limit_min"]),
        cpus_per_task=int(resources["cpus"]),
        mem=f"{int(float(resources['mem_gb']) * 1024)}M",
        array_parallelism=int(params["array_parallelism"]),
        signal_delay_s=int(params["signal_delay_s"]),
        setup=list(params.get("setup") or []),
        additional_parameters=extra,
        wckey=name,
    )
    out.update(shape_parameters(TrialShape.of(resources)))
    if resources.get("partition"):
        out["partition"] = resources["partition"]
    return out


SHAPE_PARAMETERS = ("gres", "nodes", "ntasks_per_node", "srun_args")  # what differs between jobs of two trial shapes


def shape_parameters(shape: TrialShape) -> dict[str, Any]:
    """submitit's parameters for a job of this trial shape (``SHAPE_PARAMETERS``; none for one rank without GPUs)."""
    out: dict[str, Any] = {}
    if shape.gpus_per_rank > 0:
        out["gres"] = f"gpu:{shape.gpus_per_rank * shape.tasks_per_node}"  # per node: every rank's on it
    if shape.is_gang:
        # One task a rank, started together by srun; a rank that exits with an error ends the others
        # (the gang is one trial: it fails, or is requeued, whole).
        out.update(nodes=shape.nodes, ntasks_per_node=shape.tasks_per_node, srun_args=["--kill-on-bad-exit=1"])
    return out


def job_logs(search: SearchDir, job_id: str) -> tuple[Path, Path]:
    """A trial job's output and error files (submitit's names, one task a job)."""
    paths = JobPaths(job_folder(search), job_id)
    return paths.stdout, paths.stderr
