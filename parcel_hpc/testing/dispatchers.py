"""A dispatcher with no scheduler behind it, for unit tests of the follow loop (the launch, resubmit).

``FakeDispatcher`` keeps its jobs in memory and runs nothing: a test decides what the scheduler
says (``finish`` a job, ``fail_submit`` the next submission after some tasks, an ``outage`` of
``refresh``, ``held`` jobs an earlier launch left) and reads what was asked of it (``submitted``,
``released``, ``cancelled``). The real dispatchers are held to the same interface by the
conformance tests against submitit's local executor and the dev SLURM cluster.
"""

from __future__ import annotations

from collections.abc import Sequence

from parcel_hpc.errors import SchedulerUnavailable
from parcel_hpc.scheduler.base import Dispatcher, LauncherSettings, Record, Submitted, Task, submitted_of
from parcel_hpc.scheduler.registry import DEFAULT


class FakeDispatcher(Dispatcher):
    name = DEFAULT.executor  # stands in for the embedded default's dispatcher
    can_detach = True

    def __init__(self, settings: LauncherSettings, *, slots: int = 2, capacity: int = 100) -> None:
        super().__init__(settings)
        self.n_slots = slots
        self.n_capacity = capacity
        self.running: dict[str, str] = {}  # job id -> state the scheduler would print
        self.submitted: list[list[Submitted]] = []  # the trials of each task submitted, in order
        self.fail_submit: tuple[int, SchedulerUnavailable] | None = None  # after N tasks submitted (in all), raise this
        self.outage: SchedulerUnavailable | None = None  # refresh raises it while set
        self.held: set[str] = set()  # jobs submitted held by an earlier launch, never released
        self.released: list[str] = []
        self.cancelled: list[str] = []
        self._next_id = 100

    # -- what a test says the scheduler does ---------------------------------------------------

    def finish(self, job_id: str) -> None:
        """The job left the queue (however it ended: the ledger says how)."""
        self.running.pop(job_id, None)

    # -- the interface ---------------------------------------------------------------------------

    def check(self) -> None:
        if self.outage is not None:
            raise self.outage

    def capacity(self) -> int:
        return max(0, self.n_capacity - len(self.running))

    def slots(self) -> int:
        return self.n_slots

    def submit(self, tasks: Sequence[Task], record: Record, exclude_nodes: Sequence[str] = ()) -> list[Submitted]:
        out: list[Submitted] = []
        for task in tasks:
            if self.fail_submit is not None and len(self.submitted) == self.fail_submit[0]:
                error = self.fail_submit[1]
                self.fail_submit = None
                raise error
            job_id = str(self._next_id)
            self._next_id += 1
            batch = submitted_of([task], [job_id])
            record(batch)
            self.running[job_id] = "PENDING"
            self.submitted.append(batch)
            out.extend(batch)
        return out

    def refresh(self) -> None:
        if self.outage is not None:
            raise self.outage

    def recover(self, known_jobs: set[str]) -> list[str]:
        release = sorted(j for j in self.held if j in known_jobs)  # the rest may be another launcher's: left held
        for job in release:
            self.running[job] = "PENDING"
        self.held -= set(release)
        self.released.extend(release)
        return release

    def alive(self, trial_id: str, job_id: str) -> bool:
        return job_id in self.running

    def cancel(self, job_ids: Sequence[str]) -> None:
        for job in job_ids:
            self.cancelled.append(job)
            self.running.pop(job, None)

    def describe(self, pack_lengths: Sequence[int], slots: bool = False) -> str:
        return f"fake: {len(pack_lengths)} jobs"

    def wait(self, seconds: float, at_least: float) -> None:
        """No pause: the test drives the clock."""
