"""Trial records for a poller that looks at every trial again and again (the launch following its
trials, ``status --watch``): a trial is read and folded again only when its journals changed.

A journal only grows, so the name, size and modification time of each ``journal-*.jsonl`` say
whether a trial's history changed since the last look; a spec never changes once created. On NFS a
client may cache a file's attributes for up to ``acregmax`` (60 s by default): a change can then be
seen that much later, never missed.

Must not: write, or decide anything: it returns exactly what ``SearchDir.record`` would.
"""

from __future__ import annotations

from parcel_hpc import fsio
from parcel_hpc.ledger.journal import events_in, journals
from parcel_hpc.ledger.records import TrialRecord
from parcel_hpc.ledger.store import SearchDir, read_spec


class RecordView:
    def __init__(self, search: SearchDir) -> None:
        self.search = search
        self._folded: dict[str, tuple[tuple, TrialRecord]] = {}

    def record(self, trial_id: str) -> TrialRecord:
        """``SearchDir.record``, folded again only when the trial's journals changed."""
        with fsio.Folder.open(self.search.trial_dir(trial_id), within=self.search.path) as folder:
            signature = tuple((e.name, (st := e.stat(follow_symlinks=False)).st_size, st.st_mtime_ns) for e in journals(folder))
            seen = self._folded.get(trial_id)
            if seen is not None and seen[0] == signature:
                return seen[1]
            spec = seen[1].spec if seen is not None else read_spec(folder, trial_id)  # a spec never changes
            record = self.search.fold(spec, events_in(folder))
        self._folded[trial_id] = (signature, record)
        return record

    def records(self) -> list[TrialRecord]:
        """Every trial's record, in trial order; a trial removed since it was listed (by hand, while
        this looked) is no longer the search's, and is passed over."""
        out = []
        for trial_id in self.search.trial_ids():
            try:
                out.append(self.record(trial_id))
            except FileNotFoundError:
                continue
        return out
