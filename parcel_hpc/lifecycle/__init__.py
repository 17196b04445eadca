"""A trial's life after dispatch: what to do next, how a vanished attempt ended, what to rerun.

actions.py     next_action: dispatch, wait, retry, resolve or give up (pure), and the retry policy
resolution.py  attempts that never said how they ended: what the scheduler says they did
resubmit.py    which trials a resubmission reruns, and why (pure)
settlement.py  budget holds of attempts that ended: found (pure) and settled, whoever saw the end
cancel.py      stop a search, or some of its trials, for good
systematic.py  whether the first trials failed alike, so the search stops (pure)
"""
