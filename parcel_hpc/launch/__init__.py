"""The governed launch (Hydra's Launcher role): ``python -m parcel_hpc.launch -m [overrides]``.

__main__.py   the entry point: Hydra composes the config, the ``parcel`` sweeper runs the launch
search.py     SearchLaunch: freeze, admit every proposal, commit the budget, dispatch, summarize
follow.py     Follower: dispatch, retry, propose into free slots, follow until nothing moves;
              the one submit-and-record path (the launch and ``resubmit`` both use it)
slot.py       SlotTask: a job that takes its trials (and a learning sampler's proposals) in turn
report.py     LaunchReport: what one launch did, written as its launch record
resubmit.py   ``resubmit``'s effects: read the scheduler, then dispatch through the Follower
pulse.py      the launch's heartbeat
display.py    what the launch prints
"""
