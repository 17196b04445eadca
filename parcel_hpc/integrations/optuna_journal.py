"""A search as an Optuna journal file: ``optuna-dashboard FILE`` shows its trials, their learning
curves and parameters beside the studies a team already keeps there.

One study per search, named by its revision and search id, minimizing the validation miss-cost.
Every finished trial becomes one Optuna trial, written whole in one journal line: its state
(completed: COMPLETE with its metric; pruned: PRUNED; the rest: FAIL), what its attempts reported
at each step as intermediate values (never from an attempt that ran in a quarantined directory),
its parameters with the space's distributions, when its attempts started and ended, and the
ledger's own facts as user attributes. A trial still queued or running (or quarantined, to be rerun
cleanly) is left for a later export, which adds it once finished; a trial already in the study
(by its ``parcel_trial_id``) is never written twice, so exporting again adds nothing.

Must not write under the search: it reads the ledger and appends only to the file it is given, which
it opens once (never through a link) and judges as opened: a link or a FIFO planted at FILE after
the check is never written through (Optuna's own file backend opens the path again at every read
and append). Optuna is the ``optuna`` extra: imported inside ``export_journal`` only.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from parcel_hpc import fsio
from parcel_hpc.accounting.trials import trial_rows
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import Event, SearchDir, TrialRecord, TrialState
from parcel_hpc.ledger.records import counted_milestones
from parcel_hpc.propose.learning import optuna_distributions
from parcel_hpc.propose.specs import space_of

FLAG = "--to optuna-journal"
METRIC = "validation miss-cost"
TRIAL_ID_ATTR = "parcel_trial_id"  # what makes a second export skip a trial already written


@dataclass(frozen=True)
class JournalExport:
    study_name: str
    added: int  # trials written by this export
    present: int  # finished trials an earlier export had written
    unfinished: int  # trials still queued, running or to be rerun: a later export adds them


def export_journal(search: SearchDir, path: Path) -> JournalExport:
    """Append the search's finished trials that ``path`` does not hold yet (reads the search only)."""
    _check_target(path)
    try:  # the optuna extra; the core never imports it
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileSymlinkLock
    except ImportError:
        raise UsageError(f"{FLAG} needs Optuna: pip install 'parcel_hpc[optuna]'") from None

    contract = search.contract()
    name = f"{contract['search_revision']}-{search.key()}"
    distributions = optuna_distributions(space_of(contract)[0])
    read = sorted(trial_rows(search), key=lambda t: (len(t.record.trial_id), t.record.trial_id))  # t9999 before t10000: Optuna numbers them in order
    trials = [(t.record, t.events, float(t.row["gpu_hours"])) for t in read if t.record.state.is_finished()]
    unfinished = len(read) - len(trials)

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line on the user's terminal
    with _opened(path) as journal:
        try:
            backend = _OpenedJournal(journal, JournalFileSymlinkLock(str(path)))
            storage = JournalStorage(backend)  # type: ignore[arg-type]  # duck-typed: this module imports no Optuna at its top
        except (ValueError, KeyError, TypeError, AssertionError) as exc:  # Optuna's replay asserts on an operation it does not know
            raise _not_a_journal(path, f"Optuna cannot replay it: {type(exc).__name__} {exc}") from None
        sampler = optuna.samplers.RandomSampler()  # never asked: the study only records
        if any(s.study_name == name for s in storage.get_all_studies()):
            study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        else:  # create_study on a taken name would write a line before refusing
            study = optuna.create_study(storage=storage, study_name=name, direction="minimize", sampler=sampler)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # set_metric_names and add_trials are experimental in older Optuna
            for key, value in {"contract_digest": contract.digest, "search_path": str(search.path), "metric": METRIC}.items():
                if study.user_attrs.get(key) != value:  # so exporting again writes no line
                    study.set_user_attr(key, value)
            if study.metric_names != [METRIC]:
                study.set_metric_names([METRIC])  # the dashboard's name for the objective
            written = {t.user_attrs.get(TRIAL_ID_ATTR) for t in study.get_trials(deepcopy=False)}
            new = [_trial(record, events, distributions, gpu_hours) for record, events, gpu_hours in trials if record.trial_id not in written]
            study.add_trials(new)
    return JournalExport(name, len(new), len(trials) - len(new), unfinished)


def _check_target(path: Path) -> None:
    """Before any work: a file in a folder this user can write (``_opened`` judges the file itself)."""
    fsio.check_output(path, f"{FLAG} FILE")
    try:
        with tempfile.TemporaryFile(dir=path.absolute().parent):
            pass
    except OSError as exc:
        raise _unwritable(path, exc) from None


@contextmanager
def _opened(path: Path) -> Iterator[int]:
    """FILE opened once for reading and appending, created if absent, never through a link and
    never blocking (a FIFO); judged on the descriptor: a regular file with no other name (a hard
    link would append to another file too), absent, empty or an Optuna journal (each line one JSON
    operation: appending to anything else would ruin it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, fsio.FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(f"{FLAG} {path} is a symbolic link (to {os.readlink(path)}); give the path of the file itself") from None
        raise _unwritable(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{FLAG} {path} is not a regular file, and is never written; give a file path")
        if st.st_nlink != 1:
            raise UsageError(f"{FLAG} {path} has {st.st_nlink} names (hard links): appending would change the others too; give a file of its own")
        bad = next((n for n, line in enumerate(_whole(fd).splitlines(keepends=True), 1) if not _is_operation(line)), None)
        if bad is not None:
            raise _not_a_journal(path, f"line {bad} is not a whole JSON operation")
        yield fd
    finally:
        os.close(fd)


def _whole(fd: int, start: int = 0) -> bytes:
    """The file open as ``fd`` from byte ``start`` to its end."""
    chunks: list[bytes] = []
    while chunk := os.pread(fd, 2**20, start):
        chunks.append(chunk)
        start += len(chunk)
    return b"".join(chunks)


class _OpenedJournal:
    """Optuna's journal file format (what ``JournalFileBackend`` writes and reads) on a file opened
    once: Optuna's backend opens the path again at every read and append, following whatever is
    there by then. Appends hold Optuna's own lock beside the file, as its backend does, so another
    writer of the journal (a dashboard's note) waits as it would for Optuna. Duck-typed to Optuna's
    ``BaseJournalBackend``: this module imports no Optuna."""

    def __init__(self, fd: int, lock: Any) -> None:
        self._fd = fd
        self._lock = lock
        self._starts = {0: 0}  # log number -> the byte offset its line starts at

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        number = max(n for n in self._starts if n <= log_number_from)
        offset = self._starts[number]
        for line in _whole(self._fd, offset).splitlines(keepends=True):
            if not line.endswith(b"\n"):
                return  # another writer's line, not whole yet
            offset += len(line)
            number += 1
            self._starts[number] = offset
            if number > log_number_from:
                yield json.loads(line)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = ("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode()
        self._lock.acquire()
        try:
            while data:
                data = data[os.write(self._fd, data) :]
            os.fsync(self._fd)
        finally:
            self._lock.release()


def _unwritable(path: Path, exc: OSError) -> UsageError:
    return UsageError(f"{FLAG} {path}: cannot be written ({exc.strerror}); give a file path in a folder you can write")


def _not_a_journal(path: Path, why: str) -> UsageError:
    return UsageError(f"{FLAG} {path} exists and is not an Optuna journal ({why}); give a new file or an Optuna journal file")


def _is_operation(line: bytes) -> bool:
    try:
        op = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return line.endswith(b"\n") and isinstance(op, dict) and isinstance(op.get("op_code"), int)


def _trial(record: TrialRecord, events: Sequence[Event], distributions: dict[str, Any], gpu_hours: float) -> Any:
    """One finished trial as Optuna's FrozenTrial (its number is the study's to give)."""
    from optuna.trial import FrozenTrial
    from optuna.trial import TrialState as OptunaState

    # Every other finished state (failed, rejected, budget_exhausted, cancelled) is a FAIL; its user attrs say which.
    state = {TrialState.COMPLETED: OptunaState.COMPLETE, TrialState.PRUNED: OptunaState.PRUNED}.get(record.state, OptunaState.FAIL)
    params = {k: v for k, v in record.spec.params.items() if k in distributions}
    started = [a.started for a in record.attempts if a.started is not None]
    # A trial refused or cancelled before any attempt started has only its events' times.
    start, end = min(started, default=events[0].t), record.ended_at if record.ended_at is not None else events[-1].t
    attrs: dict[str, Any] = {
        TRIAL_ID_ATTR: record.trial_id,
        "state": record.state.value,
        "reason": record.reason,
        "cause": record.cause.value if record.cause is not None else None,
        "attempts": len(record.attempts),
        "config_hash": record.spec.config_hash,
        "gpu_hours": gpu_hours,
    }
    if record.error:
        attrs["error"] = record.error
    return FrozenTrial(
        number=0,
        state=state,
        value=record.metric,
        datetime_start=datetime.fromtimestamp(start, UTC),
        datetime_complete=datetime.fromtimestamp(max(start, end), UTC),  # hosts' clocks differ: never before its start
        params=params,
        distributions={k: distributions[k] for k in params},
        user_attrs=attrs,
        system_attrs={},
        intermediate_values={m.step: m.value for _, m in counted_milestones(record, events)},
        trial_id=0,
    )
