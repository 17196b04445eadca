"""The embedded default backend: submitit's LocalExecutor on this host.

backend.py      LocalBackend: jobs judged from their own host only, the job environment, selection jobs as children
runs.py         the local executor's runs, built from the ledger in sacct's shape (reconcile reads them)
dispatcher.py   LocalDispatcher: trials as child processes of the launch, GPUs handed out
"""

from parcel_hpc.ledger import Executor

EXECUTOR = Executor("local")  # the name its jobs are recorded with (and its launcher's ``kind``)
