"""Accounting for admins: the scheduler's record of what ran, reconciled with the ledger and the budget.

    reconcile.py       reconcile one search's ledger with sacct's job runs (pure)
    account.py         account-wide totals over many searches, or every job of an account (pure)
    search_report.py   ``reconcile SEARCH_DIR``: ask sacct (or read a dump), reconcile, report
    account_report.py  ``reconcile --root`` / ``--account``: the admin's report over many searches
    scheduled.py       ``schedule-reconcile``: the reconcile as a recurring SLURM job
    listing.py         the summary of each search under a root, its spend against its caps (``list``)

sacct itself (argv, parser, states, job runs) is the SLURM backend's: ``scheduler/slurm/``.
"""
