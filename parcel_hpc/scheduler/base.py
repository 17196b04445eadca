"""The dispatcher interface: how governed trials reach a scheduler, and what it says back.

Modelled on submitit's Executor roles: the launch (``launch``, from ``propose``) decides which trials run; a
dispatcher only hands tasks to its scheduler, tells which of its jobs are alive, cancels them and
describes what it would submit. Implementations: ``local.dispatcher.LocalDispatcher`` (submitit's
LocalExecutor, the embedded default) and ``slurm.dispatcher.SlurmDispatcher`` (sbatch arrays).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from parcel_hpc import anchor
from parcel_hpc.budget import AssociationLimit
from parcel_hpc.errors import ParcelError
from parcel_hpc.ledger import Executor
from parcel_hpc.worker import gate


class Plan(Protocol):
    """What a dispatcher reads of one trial a task runs (``worker.WorkerPlan`` is one)."""

    @property
    def trial_id(self) -> str: ...


class Task(Protocol):
    """What a dispatcher submits, one job each: a ``worker.TrialTask`` (its trials) or a
    ``worker.slot.SlotTask`` (no trial: it takes them from the search)."""

    @property
    def plans(self) -> Sequence[Plan]: ...

    own_limits: bool  # each attempt stops at its own limit (the job's is longer)
    slot: str  # a slot's name; "" for a task handed its trials

    def job_minutes(self, time_limit_min: int) -> int: ...

    def __call__(self) -> Any: ...


@dataclass(frozen=True)
class Submitted:
    trial_id: str  # "" for a slot
    job_id: str  # the trials of one pack share it
    slot: str = ""  # a slot's name: it takes its trials, and journals each one's submission itself


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
        return {"kind": self.kind.value, "params": dict(self.params), "resources": dict(self.resources), "budget": dict(self.budget)}

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
        """The interpreter command that starts each job (``gate.command``), the search checked now."""
        self.check_search()
        assert self.owned is not None  # check_search raised otherwise
        return gate.command(self.owned)

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
