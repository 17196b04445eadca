"""The final partition's fence: trainer code never reads the protected files (the final lists and
the snapshot), at any moment it runs, in any process, and cannot switch the fence off.

Two layers, armed together in every process that runs trainer code before the first line of it
runs (its module's import), and held for the rest of that process:

kernel.py     Landlock: the kernel refuses the protected files to the process and to every thread and
              program it starts; nothing in the process can lift it
audit.py      Python's audit hook: records what Python-level code reaches for (the attempt is then
              ``reject:final_partition``) and refuses programs, but for torch.compile's own under
              the kernel layer; the only layer where the kernel has no Landlock
compiler.py   which programs torch.compile starts on the CPU, and the judgment of one start
protected.py  which files, and the refusal (``Unfenceable``) where a process cannot be fenced from them
arming.py     ``arm``: both layers, once per process and set of files
child.py      trainer code run in a forked child that arms itself, for a process that must stay
              unfenced: the launch (it starts the local workers, which would inherit its fence) and
              check-trainer

Who arms: a worker (``worker/attempt.py``) and a selection job (``selection/jobs.py``) arm their
own process once they have read the snapshot, before they import the trainer; the launch's trainer
checks, preflight and dry run, and check-trainer, run trainer code through ``run_fenced`` (the
trainer checks and the preflight as two stages of one child, ``run_fenced_stages``).
docs/faults-and-inputs.md ("The final partition's fence") says what each layer covers and what not.

Must not: be armed in a process that must read a protected file afterwards (both layers are one-way).
"""

from parcel_hpc.fence.arming import Armed, arm, is_armed
from parcel_hpc.fence.audit import allowed, reaches, toolkit_programs, trainer_code, tripped
from parcel_hpc.fence.child import StageAnswer, run_fenced, run_fenced_stages
from parcel_hpc.fence.compiler import counted
from parcel_hpc.fence.protected import Protected, Unfenceable

__all__ = [
    "Armed",
    "Protected",
    "StageAnswer",
    "Unfenceable",
    "allowed",
    "arm",
    "counted",
    "is_armed",
    "reaches",
    "run_fenced",
    "run_fenced_stages",
    "toolkit_programs",
    "trainer_code",
    "tripped",
]
