"""The trial ledger: the search directory, trial specs, the typed events of each trial's history,
and the records folded from them.

    states.py    TrialState, AttemptEnd, MetricResume (Enums with predicates)
    events.py    EventKind, Cause, one payload class per kind, the Event envelope and its JSON line
    journal.py   TrialWriter: the only writer of journal lines; read_events merges a trial's journals
    selection.py the selection's own journal: JobRole, its events, SelectionWriter, fold_selection
    records.py   TrialSpec, Attempt, TrialRecord and ``fold``, the one function from events to a record
    store.py     SearchDir: the layout of a search directory and its create-exclusive claims
    view.py      RecordView: records folded again only when their journals changed (pollers)
    summary.py   figures over records: counts by state, the best completed trial
    searches.py  every search under a root and each one's summary (what ``parcel-hpc list`` shows)

Nothing outside this package writes a journal line.
"""

from parcel_hpc.ledger.events import Admitted, Cause, DeviceUse, Ended, Event, EventKind, Executor, Started
from parcel_hpc.ledger.journal import TrialWriter, preview, read_events
from parcel_hpc.ledger.records import Attempt, TrialRecord, TrialSpec, fold
from parcel_hpc.ledger.selection import JobRole
from parcel_hpc.ledger.states import AttemptEnd, MetricResume, TrialState
from parcel_hpc.ledger.store import HEARTBEAT_S, Heartbeat, LauncherState, SearchDir, collector_paused
from parcel_hpc.ledger.view import RecordView

__all__ = [
    "HEARTBEAT_S",
    "collector_paused",
    "Heartbeat",
    "LauncherState",
    "Admitted",
    "Attempt",
    "AttemptEnd",
    "MetricResume",
    "Cause",
    "DeviceUse",
    "Ended",
    "Event",
    "EventKind",
    "Executor",
    "JobRole",
    "RecordView",
    "SearchDir",
    "Started",
    "TrialRecord",
    "TrialSpec",
    "TrialState",
    "TrialWriter",
    "fold",
    "preview",
    "read_events",
]
