"""SLURM job states as one Enum, mapped from sacct's text once, at the parsing edge.

Owns: the closed set of state words sacct 22.05 prints (base states and the state flags that
replace them in sacct's one-word view), and the questions the rest of parcel_hpc asks of a
state. Must not: read sacct, decide anything about trials, or let a raw state string travel
past the parser.

Each member carries a small integer ``code`` so the columnar parser can store states as an
int8 column and the Enum can be recovered with ``JobState.from_code``.
"""

from __future__ import annotations

import enum
import re

from parcel_hpc.errors import AccountingError

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

    def is_infrastructure_interruption(self) -> bool:
        """The run ended for reasons outside the job's own code: preemption, a node, a requeue.

        REQUEUED counts here: on our clusters it is written when submitit (or an admin) requeues
        the job on a preemption or time-limit signal, never when the training code fails.
        """
        return self in _INFRA

    def is_resource_limit(self) -> bool:
        """The job hit a limit it asked for (time, memory, deadline)."""
        return self in _LIMIT

    def is_cancelled(self) -> bool:
        return self in (JobState.CANCELLED, JobState.REVOKED)

    def is_failure(self) -> bool:
        """The job's own run went wrong: a non-zero exit, a launch failure, or a limit it hit."""
        return self in _FAILURE


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
_INFRA = frozenset(
    {
        JobState.PREEMPTED,
        JobState.NODE_FAIL,
        JobState.BOOT_FAIL,
        JobState.REQUEUED,
        JobState.REQUEUE_FED,
        JobState.RECONFIG_FAIL,
    }
)
_LIMIT = frozenset({JobState.TIMEOUT, JobState.OUT_OF_MEMORY, JobState.DEADLINE})
_FAILURE = frozenset({JobState.FAILED, JobState.LAUNCH_FAILED} | _LIMIT)

assert len(_BY_CODE) == len(JobState), "JobState codes must be unique"
