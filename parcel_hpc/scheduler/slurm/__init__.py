"""The SLURM backend, and every line of parcel_hpc that talks to SLURM.

backend.py           SlurmBackend: squeue's jobs, the job environment, scontrol's word on a signal, sacct's runs
selection.py         a selection job's batch script, submitted and followed with squeue
dispatcher.py        SlurmDispatcher: held ``sbatch --array`` submissions through submitit
queue.py             squeue / scontrol / sacctmgr / sshare: argv built here, text parsed (pure)
sacct.py             the sacct field list, its argv (pure) and the one place that runs it
sacct_parse.py       sacct's ``--parsable2`` text -> columns (pyarrow; no object per line)
_sacct_malformed.py  the error path: which sacct line is bad and why
runs.py              sacct's rows as runs (``scheduler.runs.JobRun``): one per allocation row of ``sacct --duplicates``
sbatch.py            batch scripts parcel_hpc renders itself (templates/), and ``sbatch``
scheduled.py         ``schedule-reconcile``: the reconcile as a recurring SLURM job
calls.py             how often this process asked SLURM, by command (the launch reports it)
"""

from parcel_hpc.ledger import Executor

EXECUTOR = Executor("slurm")  # the name its jobs are recorded with (and its launcher's ``kind``)
