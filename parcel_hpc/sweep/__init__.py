"""The governed launch: propose from the pinned space, dedup, admit, commit the budget, dispatch, follow.

search.py     SearchLaunch (one launch) and Follower (dispatch, retry, propose into free slots, follow until done)
specs.py      the contract from the composed config, trial specs and worker plans
space.py      the space in either syntax (space group, Hydra's sweep grammar), normalized; random and QMC draws
samplers.py   the pinned sampler: name, every option, revision
learning.py   a learning sampler's proposal through Optuna's ask-and-tell (pure)
proposals.py  proposals recorded create-exclusively, the Proposer, and their replay
audit.py      ``parcel-hpc proposals [--replay]``
display.py    what the launch prints
"""

from .search import Follower, LaunchReport, SearchLaunch

__all__ = ["Follower", "LaunchReport", "SearchLaunch"]
