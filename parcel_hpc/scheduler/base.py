"""The roles a scheduler backend fills: how governed trials reach a scheduler, and what it says back.

``Backend`` is everything the toolkit knows about one scheduler: its dispatcher (submit, alive,
cancel), its queue as the common ``QueuedJob`` records (a job is alive while its scheduler holds
it), the job environment a worker reads, what a signal to a job means, whether the scheduler files
its own record of each run (then an attempt's hours stay provisional until it does) and those
records (``runs``). ``registry.BACKENDS`` names each backend once; no module outside a backend's
package asks which executor a trial ran on.

Modelled on submitit's Executor roles: the launch (``launch``, from ``propose``) decides which trials run; a
dispatcher only hands tasks to its scheduler, tells which of its jobs are alive, cancels them and
describes what it would submit. Implementations: ``local.dispatcher.LocalDispatcher`` (submitit's
LocalExecutor, the embedded default) and ``slurm.dispatcher.SlurmDispatcher`` (sbatch arrays).
"""

from __future__ import annotations

import datetime as _dt
import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from parcel_hpc import anchor
from parcel_hpc.budget import AssociationLimit
from parcel_hpc.errors import ParcelError, UsageError
from parcel_hpc.governance.shape import TrialShape
from parcel_hpc.ledger import Attempt, Cause, Executor, JobRole, SearchDir, Started, TrialRecord
from parcel_hpc.probe import Liveness
from parcel_hpc.scheduler.runs import JobRun, StepUsage

if TYPE_CHECKING:  # a table is an accounting read's: what reads none loads no pyarrow (run_table)
    import pyarrow as pa


class Plan(Protocol):
    """What a dispatcher reads of one trial a task runs (``worker.WorkerPlan`` is one)."""

    @property
    def trial_id(self) -> str: ...


class Task(Protocol):
    """What a dispatcher submits, one job each: a ``worker.TrialTask`` (its trials) or a
    ``launch.slot.SlotTask`` (no trial: it takes them from the search)."""

    @property
    def plans(self) -> Sequence[Plan]: ...

    own_limits: bool  # each attempt stops at its own limit (the job's is longer)
    slot: str  # a slot's name; "" for a task handed its trials

    @property
    def shape(self) -> TrialShape | None: ...  # its job's: its trials' (a pack's share one), a slot's own; None: the launch's

    def job_minutes(self, time_limit_min: int) -> int: ...

    def __call__(self) -> Any: ...


@dataclass(frozen=True)
class Submitted:
    trial_id: str  # "" for a slot
    job_id: str  # the trials of one pack share it
    slot: str = ""  # a slot's name: it takes its trials, and journals each one's submission itself


def job_shape(task: Task, resources: Mapping[str, Any]) -> TrialShape:
    """The shape of a task's job: the task's own, else the launch's ``resources`` (a slot of a search of one shape)."""
    return task.shape or TrialShape.of(resources)


def submitted_of(tasks: Sequence[Task], job_ids: Sequence[str]) -> list[Submitted]:
    """Every trial of each task (a slot: its name), with its task's job id."""
    out = []
    for task, job_id in zip(tasks, job_ids):
        out += [Submitted("", job_id, task.slot)] if task.slot else [Submitted(plan.trial_id, job_id) for plan in task.plans]
    return out


@dataclass(frozen=True)
class LauncherSettings:
    """What a launch dispatched with, recorded in its launch record so ``resubmit`` can do the same."""

    kind: Executor
    params: Mapping[str, Any]  # the hydra/launcher group's values
    resources: Mapping[str, Any]
    budget: Mapping[str, Any]

    def to_json(self) -> dict:
        return {"kind": str(self.kind), "params": dict(self.params), "resources": dict(self.resources), "budget": dict(self.budget)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LauncherSettings:
        return cls(Executor(obj["kind"]), obj["params"], obj["resources"], obj["budget"])


# Called with what was submitted before any of it may start, so the ledger knows every job id first.
Record = Callable[[Sequence[Submitted]], None]


class Dispatcher(ABC):
    name: ClassVar[Executor]  # recorded in each ``submitted`` event
    can_detach: ClassVar[bool]  # whether trials outlive the launching process

    def __init__(self, settings: LauncherSettings) -> None:
        self.settings = settings
        self.owned: anchor.Owned | None = None  # the search directory its jobs act for (``acts_for``)

    def acts_for(self, owned: anchor.Owned) -> None:
        """The search directory every job of this dispatcher acts for, as the launch found it at its
        door: each job's command line carries it, and the job holds it before submitit unpickles
        anything (``worker.gate``)."""
        self.owned = owned

    def check_search(self) -> None:
        """``NotTheSearch`` (one line) when the directory under the search's name is not the one this
        dispatcher acts for any more: a launch asks before each round and each submission."""
        if self.owned is None:
            raise ParcelError("a dispatcher acts for a search only once the launch said which (acts_for)")
        anchor.check(self.owned)

    def job_python(self) -> str:
        """The interpreter command that starts each job (``anchor.job_command``), the search checked now."""
        self.check_search()
        assert self.owned is not None  # check_search raised otherwise
        return anchor.job_command(self.owned)

    def launch_record(self) -> dict:
        """What a launch record says this dispatcher submitted with (``resubmit`` reads it back)."""
        return self.settings.to_json()

    def recover(self, known_jobs: set[str]) -> list[str]:
        """After a launch died between submitting and releasing: start the held jobs the ledger
        knows, and leave alone the held jobs it does not (another launcher's, between its sbatch and
        its records). Call after ``refresh``; returns what it released."""
        return []

    def account_limits(self) -> tuple[str, list[AssociationLimit]] | None:
        """The account this launch's jobs are charged to and the association limits they count
        against, read now; None where jobs are charged to no account (this machine)."""
        return None

    def scheduler_calls(self) -> dict[str, int]:
        """The scheduler commands this process ran, by name (none where the scheduler is this machine)."""
        return {}

    def wait(self, seconds: float, at_least: float) -> None:
        """Pause between two follow rounds: ``seconds``, or from ``at_least`` on, until one of this
        launch's jobs ends where the dispatcher can tell (the next proposal then goes out at once)."""
        time.sleep(seconds)

    @abstractmethod
    def check(self) -> None:
        """Raise SchedulerUnavailable (one line, exit 2) when the scheduler cannot be reached."""

    @abstractmethod
    def capacity(self) -> int:
        """How many more jobs (tasks, each one or more trials) may be submitted now."""

    @abstractmethod
    def slots(self) -> int:
        """How many of this launch's jobs run at once (what packing must leave busy)."""

    def max_job_minutes(self) -> float | None:
        """The longest time limit the scheduler accepts for a job here (None: no limit)."""
        return None

    @abstractmethod
    def submit(self, tasks: Sequence[Task], record: Record, exclude_nodes: Sequence[str] = ()) -> list[Submitted]:
        """Submit ``tasks``, one job each, its time limit the task's (``Task.job_minutes``);
        ``record`` is called with the job ids of each trial before any of them can start. Several
        calls of ``record`` are one batch each: what was recorded before a failure is submitted."""

    @abstractmethod
    def refresh(self) -> None:
        """Ask the scheduler once for the state of this search's jobs (``alive`` reads the answer)."""

    @abstractmethod
    def alive(self, trial_id: str, job_id: str) -> bool:
        """Whether the scheduler still holds this job (pending, running, requeued); ``trial_id``: a
        trial of it, or its slot's name."""

    @abstractmethod
    def cancel(self, job_ids: Sequence[str]) -> None:
        """Ask the scheduler to end these jobs."""

    @abstractmethod
    def describe(self, pack_lengths: Sequence[int], slots: bool = False) -> str:
        """What submitting jobs of these many trials each would do (the dry run prints it); with
        ``slots``, jobs that take trials in turn, with room for these many at the time limit."""


class QueueState(enum.Enum):
    """What a scheduler says of a job it still holds."""

    PENDING = "pending"  # waits for resources (or is held)
    RUNNING = "running"
    SUSPENDED = "suspended"
    REQUEUED = "requeued"  # ended a run and waits to run again
    ENDING = "ending"  # its run is ending (SLURM's COMPLETING): still held


@dataclass(frozen=True)
class QueuedJob:
    """A job its scheduler holds now: it is alive while listed (and only then)."""

    job_id: str  # "123" or "123_4"
    state: QueueState
    reason: str  # why it waits, in the scheduler's words
    nodes: str
    restarts: int = 0  # how often the scheduler requeued it (the restart count of its next run)


@dataclass(frozen=True)
class SelectionJob:
    """A selection job (the winner's rerun, the final evaluation) for a backend to run: it runs
    ``parcel-hpc selection-job`` on the search ``owned``, as the launch's trials ran."""

    search: SearchDir
    owned: anchor.Owned  # the search directory as the command found it: the job holds it to this
    role: JobRole
    selection: int  # the selection's number
    settings: LauncherSettings  # the launcher the trials ran on: its resources (partition, account, qos, GPUs, memory)
    time_limit_min: int
    log_dir: Path  # its output goes to ``<role>-<job id>.out`` there
    shape: TrialShape = TrialShape()  # a gang's rerun runs as a gang of the winner's own shape: one task a rank

    def log(self, job_id: str) -> Path:
        return self.log_dir / f"{self.role.value}-{job_id}.out"


@dataclass(frozen=True)
class ReconcileSchedule:
    """An admin's ``schedule-reconcile``: ``reconcile SEARCH_DIR --json`` as a job of the
    scheduler, again every ``every_min``."""

    search_dir: Path
    output_dir: Path  # where the script and each run's report and errors go
    every_min: int  # minutes between runs; 0: one run (cron submits the written script)
    partition: str  # "": the cluster's default
    account: str  # "": the submitter's default
    qos: str  # "": the account's default
    time_limit_min: int  # minutes, each run
    mem: str  # each run's memory, like "1G"


# Called with a selection job's id and the host it runs on ("": the scheduler's) once it is submitted.
Submit = Callable[[str, str], None]


class Backend(ABC):
    """Everything the toolkit knows about one scheduler (``registry.BACKENDS`` names each once)."""

    executor: ClassVar[Executor]  # recorded with each job it runs
    files_runs: ClassVar[bool]  # the scheduler files its own record of each run: hours stay provisional until it does
    accounting: ClassVar[str]  # what its record of runs is called in a report ("sacct")
    queues_jobs: ClassVar[bool]  # a job waits in its queue and runs without the process that submitted it
    launcher: ClassVar[type]  # the schema (a dataclass) of its ``hydra/launcher`` group; its ``kind`` is ``executor``
    launcher_name: ClassVar[str]  # that group's option name: ``hydra/launcher=<launcher_name>``

    @abstractmethod
    def dispatcher(self, settings: LauncherSettings, search: SearchDir, max_num_timeout: int, env: Mapping[str, str]) -> Dispatcher:
        """The dispatcher of a launch on this scheduler."""

    @abstractmethod
    def job_logs(self, search: SearchDir, job_id: str) -> tuple[Path, Path]:
        """A trial job's output and error files."""

    @abstractmethod
    def held(self, search: SearchDir, records: Sequence[TrialRecord]) -> dict[str, QueuedJob]:
        """The jobs of ``records`` (this backend's) that the scheduler still holds, asked once; a job
        this host cannot judge (a local job of another host) counts as held. SchedulerUnavailable
        (one line) when the scheduler does not answer."""

    @abstractmethod
    def started(self, env: Mapping[str, str], host: str, pid: int, process_started: float | None) -> Started | None:
        """The facts of a job of this scheduler read from its environment; None where ``env`` is not one."""

    def judged_here(self, attempt: Attempt) -> bool:
        """Whether this host can tell that the job ``attempt`` ran in has ended (a cluster's queue
        answers from any of its hosts)."""
        return True

    @abstractmethod
    def run_selection_job(self, job: SelectionJob, submitted: Submit, poll_s: float) -> str:
        """Submit ``job``, tell ``submitted`` its id before it can end, and wait until it ended; its id."""

    @abstractmethod
    def selection_job_liveness(self, job_id: str, host: str, search: SearchDir, role: JobRole) -> Liveness:
        """Whether a selection job of ``search`` still runs (``host``: where a local one started)."""

    def signal_cause(self, facts: Started) -> Cause:
        """What an early signal to a job of this scheduler means (its sender: the time limit, unless
        the scheduler says it preempted the job)."""
        return Cause.TIMEOUT

    def runs(self, job_ids: Sequence[str]) -> dict[str, list[JobRun]]:
        """The scheduler's record of every run of these jobs, by job id (``files_runs`` backends); a
        failing accounting tool raises (AccountingError)."""
        return {}

    def steps(self, job_ids: Sequence[str]) -> list[StepUsage]:
        """What the tasks of these jobs' steps used, as the scheduler measured it (a gang's ranks are a
        step's tasks); none where it measures none. A failing accounting tool raises (AccountingError)."""
        return []

    def listed(self, search: SearchDir) -> pa.Table:
        """Every run of every user the scheduler filed under ``search``'s job names since the search
        began (``run_table.RUN_SCHEMA``): those the ledger lacks are orphans. None where it files none."""
        from parcel_hpc.scheduler.run_table import runs_table

        return runs_table([])

    def account_runs(self, account: str, since: _dt.datetime) -> pa.Table:
        """Every run of every user charged to ``account`` since ``since`` (``run_table.RUN_SCHEMA``, a
        run straddling ``since`` counted from it); none where jobs are charged to no account."""
        from parcel_hpc.scheduler.run_table import runs_table

        return runs_table([])

    def known_accounts(self) -> list[str]:
        """Every account this scheduler charges jobs to, sorted; none where it charges none."""
        return []

    def dump_runs(self, path: Path) -> pa.Table | None:
        """The runs of an accounting dump exported from this scheduler (``reconcile --sacct-file``,
        ``run_table.RUN_SCHEMA``); None where it exports none. UsageError (one line, how to export one)
        when the file cannot be read."""
        return None

    def node_names(self, node_list: str) -> list[str]:
        """A run's node list (``AttemptLine.node``) as node names, in the scheduler's order."""
        return [node_list]

    def node_address(self, node: str) -> str:
        """Where the other ranks of a gang reach ``node`` (the job's first host, rank 0's): its name."""
        return node

    def gang_refusal(self, shape: TrialShape) -> str:
        """Why this backend cannot run a trial of ``shape`` ("" where it can): a gang's ranks start
        together only where the backend starts them (``worker/task.py`` gives each its role)."""
        return f"the {self.executor} executor runs each trial as one process in this version (gangs on it: issue 50, not built yet)" if shape.is_gang else ""

    def check_launcher(self, launcher: Mapping[str, Any]) -> None:
        """Its launcher group's own values checked (``governance.validation.checked`` calls this in
        turn; UsageError, one line); the schema's types Hydra checked already. Nothing more by default."""
        return None

    def schedule_reconcile(self, request: ReconcileSchedule, dry_run: bool) -> None:
        """Queue ``request`` and print its job id and how to stop the schedule; with ``dry_run``,
        print what would be queued and write nothing. UsageError where jobs do not wait in a queue
        (``queues_jobs`` false)."""
        raise UsageError(
            f"schedule-reconcile needs a scheduler that queues jobs; the {self.executor} executor runs none later: run `parcel-hpc reconcile` instead"
        )

    def local_runs(self, records: Sequence[TrialRecord], user: str) -> list[JobRun] | None:
        """The runs of ``records`` as this backend recorded them itself, where the scheduler files
        none (``files_runs`` false); None where it does."""
        return None
