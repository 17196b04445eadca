"""Schedulers: how governed trials reach one, and what it says back. Decides nothing about which
trials to run (``launch`` and ``propose`` do).

    base.py        Dispatcher (the interface every backend implements), Task, Submitted, LauncherSettings
    packing.py     how many trials one job runs in turn, and which share a job (pure; no submitit)
    slots.py       which queued trial a slot takes next, a trial's expected length (pure; no submitit)
    factory.py     the launcher's ``kind`` -> its backend's dispatcher
    local/         the embedded default: submitit's LocalExecutor, trials as child processes
    slurm/         SLURM: held sbatch arrays, squeue/scontrol, sacct argv + parser + states,
                   the batch scripts parcel_hpc renders itself and their templates

Importing this package imports no backend (and so not submitit): ``factory`` does.
"""
