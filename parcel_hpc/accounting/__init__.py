"""Accounting for admins: the scheduler's record of what ran, reconciled with the ledger and the budget.

    reconcile.py       reconcile one search's ledger with sacct's job runs (pure)
    account.py         account-wide totals over many searches, or every job of an account (pure)
    search_report.py   ``reconcile SEARCH_DIR``: ask the search's scheduler (or read a dump), reconcile, report
    account_report.py  ``reconcile --root`` / ``--account``: the admin's report over many searches
    listing.py         the summary of each search under a root, its spend against its caps (``list``)

The runs they read are the common record (``scheduler/runs.py``), from each backend
(``scheduler/base.Backend``: ``runs``, ``listed``, ``account_runs``, ``dump_runs``); sacct itself
(argv, parser) and the reconcile as a recurring SLURM job (``schedule-reconcile``) are the SLURM
backend's: ``scheduler/slurm/``.
"""
