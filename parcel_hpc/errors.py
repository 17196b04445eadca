"""One error root for parcel_hpc, and the exit code each kind maps to.

    ParcelError                      exit 1: a bug or an unexpected state; never a user's fault
    ├── UsageError                   exit 2: bad input; the message names the problem and the fix
    │   ├── SchedulerUnavailable     SLURM cannot be reached (no SLURM_CONF, slurmctld down)
    │   └── AccountingError          sacct failed or its text could not be parsed
    ├── CorruptRecord                exit 2: a record on disk is unreadable (not a torn last line)
    ├── CheckpointCollision          exit 2: another trial's claim or checkpoint in our directory (claims.py)
    └── GovernanceRefusal            exit 3: the search refused to go on; carries the outcome string
                                     (``reject:<field>``, ``hold:budget``)

Not errors: ``EXIT_PENDING`` (4), ``reconcile``'s answer when the scheduler has not filed every job
in full yet (its report is printed; rerun it, or pass ``--wait SECONDS``).

Messages are one line: the CLI prints ``error: <message>`` (or the outcome string) and exits.
"""

from __future__ import annotations

EXIT_PENDING = 4


class ParcelError(Exception):
    exit_code = 1


class UsageError(ParcelError):
    exit_code = 2


class SchedulerUnavailable(UsageError):
    pass


class ReleaseFailed(SchedulerUnavailable):
    """The jobs were submitted and recorded, but could not be released from their hold."""


class AccountingError(UsageError):
    pass


class CorruptRecord(ParcelError):
    exit_code = 2


class GovernanceRefusal(ParcelError):
    """A governance decision that stops the command: the outcome string is the first thing printed."""

    exit_code = 3

    def __init__(self, outcome: str, detail: str = "") -> None:
        self.outcome = outcome
        self.detail = detail
        super().__init__(f"{outcome}: {detail}" if detail else outcome)
