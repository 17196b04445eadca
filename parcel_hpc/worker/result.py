"""What a job's task returns for each trial it ran or passed by, typed: submitit pickles it as the
job's result (``job.result()``), and a pack reads back only whether a trial runs ``again``.

Must not: carry anything the ledger does not already hold (the journal is the record; this is a
summary of what the job did).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from parcel_hpc.ledger import Cause


class Ran(enum.Enum):
    """How a trial's turn in a job went."""

    COMPLETED = "completed"  # ended with its metric
    ALREADY_FINISHED = "already_finished"  # a late requeue or a duplicate dispatch of a finished trial: never trained twice
    STOPPED = "stopped"  # stopped without a result, its reason journaled (``why``)
    INTERRUPTED = "interrupted"  # saved and interrupted (``cause``; ``again``: it resumes later in this job)
    SUPERSEDED = "superseded"  # a newer attempt of the same trial took its checkpoint directory over
    QUARANTINED = "quarantined"  # its checkpoint directory collided with another trial's
    REJECTED = "rejected"  # it asked for the final partition
    FAILED = "failed"  # a trial of a pack or slot failed (``why``: the error); the job goes on
    SKIPPED = "skipped"  # passed by in a pack (``why``)
    SLOT_STOPPED = "slot_stopped"  # a slot stopped taking trials (``why``)


@dataclass(frozen=True)
class WorkerResult:
    trial_id: str  # "" for a slot's own line
    ran: Ran
    why: str = ""  # in words: why it was skipped, stopped or failed
    metric: float | None = None  # COMPLETED: its value
    step: int | None = None  # COMPLETED: the step it was scored at
    cause: Cause | None = None  # INTERRUPTED: why
    again: bool = False  # INTERRUPTED at its own limit within its retries: it resumes after the pack's others
    slot: str = ""  # SLOT_STOPPED: the slot's name
