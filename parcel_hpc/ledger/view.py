"""Trial records for a poller that looks at every trial again and again (the launch following its
trials, ``status --watch``): a trial is read and folded again only when its journals changed.

A journal only grows, so the name, size and modification time of each ``journal-*.jsonl`` say
whether a trial's history changed since the last look; a spec never changes once created. On NFS a
client may cache a file's attributes for up to ``acregmax`` (60 s by default): a change can then be
seen that much later, never missed.

Must not: write, or decide anything: it returns exactly what ``SearchDir.record`` would.
"""

from __future__ import annotations

import os

from parcel_hpc.ledger.journal import journals
from parcel_hpc.ledger.records import TrialRecord
from parcel_hpc.ledger.store import SearchDir


class RecordView:
    def __init__(self, search: SearchDir) -> None:
        self.search = search
        self._folded: dict[str, tuple[tuple, TrialRecord]] = {}

    def record(self, trial_id: str) -> TrialRecord:
        signature = _signature(self.search.trial_dir(trial_id))
        seen = self._folded.get(trial_id)
        if seen is not None and seen[0] == signature:
            return seen[1]
        spec = seen[1].spec if seen is not None else self.search.spec(trial_id)  # a spec never changes
        record = self.search.fold(spec, self.search.events(trial_id))
        self._folded[trial_id] = (signature, record)
        return record


def _signature(trial_dir: os.PathLike) -> tuple:
    return tuple((e.name, (st := e.stat()).st_size, st.st_mtime_ns) for e in journals(trial_dir))
