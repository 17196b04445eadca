"""The first code of every job a dispatcher submits: hold the search directory, then hand over to submitit.

submitit's own entry (``python -u -m submitit.core._submit FOLDER``) unpickles the job's task from
FOLDER at once, and a queued SLURM job resolves FOLDER by name when it starts, maybe days after it
was submitted: a directory swapped under the search's name meanwhile would hand it someone else's
pickles. So a dispatcher starts its jobs through this module instead (``command``, as submitit's
``python``; submitit appends its own ``-u -m submitit.core._submit FOLDER``)::

    python -P -u -m parcel_hpc.worker.gate SEARCH UID INODE ID -u -m submitit.core._submit FOLDER

The search's identity rides on the command line, which the scheduler keeps (``sbatch`` stores the
script; the local executor's child gets it in its environment), out of the root's reach. The gate
holds the directory (``anchor.hold``) before anything is unpickled, imported or written: a
directory that is not the search its job was submitted for (moved away and replaced, re-owned,
opened to others) is refused in one line on stderr, which the scheduler writes to the job's output
file, and the job exits 2 having written nothing. Otherwise submitit reads FOLDER through the held
directory, and so does everything the task opens in the search. ``-P`` keeps the job's working
directory (a checkout, a shared folder) off the import path: the installed parcel_hpc and
submitit run, never a folder's copy of them.

Owns: the job's command line and its check. Must not: read anything of the search before it holds it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from submitit.core import submission

from parcel_hpc import anchor
from parcel_hpc.errors import UsageError, exit_on_error
from parcel_hpc.fsio import owner_only_writes


def parse(argv: Sequence[str]) -> tuple[anchor.Owned, str]:
    """The search's identity and submitit's job folder from the gate's arguments (``anchor.job_command``'s)."""
    if len(argv) != 8 or tuple(argv[4:7]) != anchor.SUBMITIT_ENTRY:
        raise UsageError(
            f"usage: python -m {anchor.GATE_MODULE} SEARCH UID INODE ID {' '.join(anchor.SUBMITIT_ENTRY)} FOLDER (a dispatcher writes this line, not a person)"
        )
    owned = anchor.Owned.from_argv(list(argv[:4]))
    folder = os.path.abspath(argv[7])
    if not folder.startswith(owned.path + os.sep):
        raise UsageError(f"job folder {folder} is not inside its search {owned.path}; the job was not submitted by parcel_hpc")
    return owned, folder


def main(argv: Sequence[str]) -> None:
    with exit_on_error():
        owned, folder = parse(argv)
        anchor.hold(owned)
    owner_only_writes()
    submission.process_job(anchor.resolve(folder))


if __name__ == "__main__":
    main(sys.argv[1:])
