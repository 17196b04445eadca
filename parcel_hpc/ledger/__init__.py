"""The trial ledger: the search directory, trial specs, the typed events of each trial's history,
and the records folded from them.

    states.py    TrialState, AttemptEnd (Enums with predicates)
    events.py    EventKind, Cause, one payload class per kind, the Event envelope and its JSON line
    journal.py   TrialWriter: the only writer of journal lines; read_events merges a trial's journals
    selection.py the selection's own journal: Outcome, JobRole, its events, SelectionWriter, fold_selection
    records.py   TrialSpec, Attempt, TrialRecord and ``fold``, the one function from events to a record
    store.py     SearchDir: the layout of a search directory and its create-exclusive claims
    view.py      RecordView: records folded again only when their journals changed (pollers)

Nothing outside this package writes a journal line.
"""

from .events import Admitted, Cause, Ended, Event, EventKind, Executor, Started
from .journal import TrialWriter, preview, read_events
from .records import Attempt, TrialRecord, TrialSpec, fold
from .selection import JobRole, Outcome
from .states import AttemptEnd, TrialState
from .store import HEARTBEAT_S, Heartbeat, LauncherState, SearchDir
from .view import RecordView

__all__ = [
    "HEARTBEAT_S",
    "Heartbeat",
    "LauncherState",
    "Admitted",
    "Attempt",
    "AttemptEnd",
    "Cause",
    "Ended",
    "Event",
    "EventKind",
    "Executor",
    "JobRole",
    "Outcome",
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
