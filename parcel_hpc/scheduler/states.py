"""A run's state, in sacct's words: the state of the common record of a run (``runs.JobRun``), one
Enum every backend's accounting maps to (SLURM's parser from sacct's text, the local backend from
the ledger's attempt ends), because admins read sacct's states beside it.

Owns: the closed set of state words sacct 22.05 prints (base states and the state flags that
replace them in sacct's one-word view), the questions the rest of parcel_hpc asks of a state,
and the one table of what each ending means for an attempt (``JobState.cause``). Must not: read
sacct, decide anything about trials, or let a raw state string travel past a parser.

Each member carries a small integer ``code`` so a columnar table can store states as an int8
column and the Enum can be recovered with ``JobState.from_code``.
"""

from __future__ import annotations

import enum
import re

from parcel_hpc.errors import AccountingError
from parcel_hpc.ledger.events import Cause

# "CANCELLED by 0": sacct appends the uid that cancelled the job (print.c: "%s by %u").
_CANCELLED_BY = re.compile(r"^CANCELLED by \d+$")


class JobState(enum.Enum):
    # value = the word sacct prints; code = the int8 stored in parsed columns (stable: append only)
    PENDING = ("PENDING", 0)
    RUNNING = ("RUNNING", 1)
    SUSPENDED = ("SUSPENDED", 2)
    COMPLETED = ("COMPLETED", 3)
    CANCELLED = ("CANCELLED", 4)
    FAILED = ("FAILED", 5)
    TIMEOUT = ("TIMEOUT", 6)
    NODE_FAIL = ("NODE_FAIL", 7)
    PREEMPTED = ("PREEMPTED", 8)
    BOOT_FAIL = ("BOOT_FAIL", 9)
    DEADLINE = ("DEADLINE", 10)
    OUT_OF_MEMORY = ("OUT_OF_MEMORY", 11)
    # State flags that sacct prints instead of the base state when set.
    REQUEUED = ("REQUEUED", 12)
    REQUEUE_FED = ("REQUEUE_FED", 13)
    REQUEUE_HOLD = ("REQUEUE_HOLD", 14)
    SPECIAL_EXIT = ("SPECIAL_EXIT", 15)
    RESIZING = ("RESIZING", 16)
    REVOKED = ("REVOKED", 17)
    COMPLETING = ("COMPLETING", 18)
    CONFIGURING = ("CONFIGURING", 19)
    STAGE_OUT = ("STAGE_OUT", 20)
    STOPPED = ("STOPPED", 21)
    SIGNALING = ("SIGNALING", 22)
    RESV_DEL_HOLD = ("RESV_DEL_HOLD", 23)
    POWER_UP_NODE = ("POWER_UP_NODE", 24)
    LAUNCH_FAILED = ("LAUNCH_FAILED", 25)
    RECONFIG_FAIL = ("RECONFIG_FAIL", 26)
    UPDATE_DB = ("UPDATE_DB", 27)

    def __init__(self, text: str, code: int) -> None:
        self.text = text
        self.code = code

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Map one sacct State field to a member; unknown text raises AccountingError."""
        state = _BY_TEXT.get(text)
        if state is not None:
            return state
        if _CANCELLED_BY.match(text):
            return cls.CANCELLED
        raise AccountingError(
            f"unknown SLURM job state {text!r}; parcel_hpc knows {', '.join(sorted(_BY_TEXT))} "
            "and 'CANCELLED by <uid>' (a newer SLURM? add the state to JobState)"
        )

    @classmethod
    def from_code(cls, code: int) -> JobState:
        return _BY_CODE[code]

    def is_active(self) -> bool:
        """The run holds or waits for resources: it may still run or change state."""
        return self in _ACTIVE

    def is_terminal(self) -> bool:
        """This run is over (the job as a whole may run again after a requeue)."""
        return self not in _ACTIVE

    def is_success(self) -> bool:
        return self is JobState.COMPLETED

    def cause(self) -> Cause | None:
        """What this ending means for the attempt that ran in it (the one table, ``_CAUSE``); None
        for a state that says nothing of why (the attempt is then ``lost``)."""
        return _CAUSE.get(self)

    def is_cancelled(self) -> bool:
        return self in (JobState.CANCELLED, JobState.REVOKED)


_BY_TEXT = {s.text: s for s in JobState}
_BY_CODE = {s.code: s for s in JobState}
_ACTIVE = frozenset(
    {
        JobState.PENDING,
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.REQUEUE_HOLD,
        JobState.SPECIAL_EXIT,
        JobState.COMPLETING,
        JobState.CONFIGURING,
        JobState.STAGE_OUT,
        JobState.STOPPED,
        JobState.SIGNALING,
        JobState.RESV_DEL_HOLD,
        JobState.POWER_UP_NODE,
        JobState.UPDATE_DB,
    }
)
# How a run that ended without a result ended, as the attempt's cause: the one table every reader
# (resolution of vanished attempts, resubmit, reconcile) uses. BOOT_FAIL is a node that never came
# up: the machine's fault, like NODE_FAIL. DEADLINE is the allocation's --deadline passing: a
# limit of the allocation, not of the design, so it is retried from the checkpoint like TIMEOUT.
# OUT_OF_MEMORY is the design's (a training failure). Anything else ended the job without saying
# why (FAILED: the worker would have said; REQUEUED: the next run says): ``lost``.
_CAUSE = {
    JobState.NODE_FAIL: Cause.NODE_FAIL,
    JobState.BOOT_FAIL: Cause.NODE_FAIL,
    JobState.PREEMPTED: Cause.PREEMPTED,
    JobState.TIMEOUT: Cause.TIMEOUT,
    JobState.DEADLINE: Cause.TIMEOUT,
    JobState.CANCELLED: Cause.CANCELLED,
    JobState.REVOKED: Cause.CANCELLED,
    JobState.OUT_OF_MEMORY: Cause.OUT_OF_MEMORY,
}

assert len(_BY_CODE) == len(JobState), "JobState codes must be unique"
