"""A launch's heartbeat: ``launches/<launch_id>.heartbeat`` rewritten every ``HEARTBEAT_S`` by a
thread from the moment the contract is frozen until the launch leaves, then its last word (ended,
detached, or stopped when it left by an exception).

A thread, not the follow loop: a loop blocked in a slow sbatch, a long dispatch or a scheduler
outage is still a live launch, and ``parcel-hpc list`` and ``status --watch`` must not call it gone.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from parcel_hpc.errors import NotTheSearch
from parcel_hpc.governance.outcome import GovernanceRefusal
from parcel_hpc.ledger import HEARTBEAT_S, Heartbeat, LauncherState, SearchDir


class Pulse:
    """``with Pulse(search, launch_id) as pulse: ...; pulse.leaving(LauncherState.ENDED)``; an
    exception leaves STOPPED, except a refusal after the launch said how it leaves (``hold:no-result``
    once every trial ended keeps ENDED; a launch that dispatched nothing keeps no word)."""

    def __init__(self, search: SearchDir, launch_id: str, beating: bool = True, interval_s: float = HEARTBEAT_S) -> None:
        self.search = search
        self.launch_id = launch_id
        self.beating = beating  # a dry run writes nothing
        self.interval_s = interval_s
        self.last_word: LauncherState | None = LauncherState.STOPPED  # unless the launch says how it leaves
        self._said = False  # the launch said how it leaves (``leaving``, ``withdraw``)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat_until_stopped, name=f"heartbeat-{launch_id}", daemon=True)

    def leaving(self, how: LauncherState) -> None:
        self.last_word, self._said = how, True

    def withdraw(self) -> None:
        """Leave no word at all (a launch that dispatched nothing)."""
        self.last_word, self._said = None, True

    def __enter__(self) -> Pulse:
        if self.beating:
            self._write(LauncherState.FOLLOWING)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if not self.beating:
            return
        self._stop.set()
        self._thread.join()
        if exc_type is not None and issubclass(exc_type, NotTheSearch):
            return  # the directory under the search's name is someone else's now: nothing more is written there
        if exc_type is not None and not (self._said and issubclass(exc_type, GovernanceRefusal)):
            self._write(LauncherState.STOPPED)  # interrupted, or failed: whatever it meant to say, it stopped
        elif self.last_word is None:
            self.search.withdraw_heartbeat(self.launch_id)
        else:
            self._write(self.last_word)

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._write(LauncherState.FOLLOWING)
            except OSError:
                continue  # the filesystem hiccuped: the next beat tries again (the launch itself will say more)

    def _write(self, state: LauncherState) -> None:
        self.search.write_heartbeat(self.launch_id, Heartbeat(time.time(), socket.gethostname(), os.getpid(), state))
