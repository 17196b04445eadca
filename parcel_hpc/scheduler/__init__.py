"""Schedulers: how governed trials reach one, and what it says back. Decides nothing about which
trials to run (``launch`` and ``propose`` do).

    base.py        the roles a backend fills: Backend (queue, job environment, runs, selection jobs),
                   Dispatcher (submit, alive, cancel), Task, Submitted, LauncherSettings, QueuedJob
    runs.py        the common record of a run every backend's accounting produces (JobRun, in sacct's shape)
    states.py      its state (JobState, sacct's words) and the one table of what each ending means
    registry.py    the backends by executor: the one module that names every backend
    packing.py     how many trials one job runs in turn, and which share a job (pure; no submitit)
    slots.py       which queued trial a slot takes next, a trial's expected length (pure; no submitit)
    factory.py     the launcher's ``kind`` -> its backend's dispatcher (through the registry)
    local/         the embedded default: submitit's LocalExecutor, trials as child processes
    slurm/         SLURM: held sbatch arrays, squeue/scontrol, sacct argv + parser,
                   the batch scripts parcel_hpc renders itself and their templates

Importing this package imports no backend; the registry imports each backend's light half
(``backend.py``), and a backend's dispatcher (submitit) is imported when a launch makes one.
"""
