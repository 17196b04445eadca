"""The governed launch: propose from the pinned space, dedup, admit, commit the budget, dispatch, follow.

search.py     SearchLaunch (one launch) and Follower (dispatch, retry, follow until done)
proposal.py   the contract from the composed config, proposals and worker plans
space.py      sampling the pinned space
display.py    what the launch prints
"""

from .search import Follower, LaunchReport, SearchLaunch

__all__ = ["Follower", "LaunchReport", "SearchLaunch"]
