"""A real local search exported as an Optuna journal: read back by Optuna's own JournalStorage and
by optuna-dashboard itself; exporting again adds nothing, unfinished trials wait for a later export,
the search is never written, and a wrong target is one line, exit 2, with nothing written."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from mlflow_server import free_port

from parcel_hpc.errors import UsageError
from parcel_hpc.integrations.optuna_journal import METRIC, JournalExport, export_journal
from parcel_hpc.ledger import Event, EventKind, SearchDir, TrialState, fold
from parcel_hpc.ledger.events import Milestone, Quarantined
from parcel_hpc.ledger.records import counted_milestones
from parcel_hpc.propose.learning import optuna_distributions
from parcel_hpc.propose.specs import space_of
from parcel_hpc.testing import faults, launch, parcel_hpc
from parcel_hpc.testing.runs import subprocess_env, wait_for
from parcel_hpc.worker.training import STEP_HOOK_ENV

optuna = pytest.importorskip("optuna")
pytestmark = pytest.mark.xdist_group("optuna-journal")  # one search for the module's tests

OPTUNA_STATE = {TrialState.COMPLETED: "COMPLETE", TrialState.PRUNED: "PRUNED", TrialState.FAILED: "FAIL"}


@pytest.fixture(scope="module")
def search(tmp_path_factory, artifacts) -> SearchDir:
    """12 trials, a quarter of them raising at step 5: completed, pruned (ASHA) and failed ones."""
    root = tmp_path_factory.mktemp("journal")
    data = root / "data"
    shutil.copytree(artifacts["dir"], data)
    overrides = [f"search.root={root / 'runs'}", "search.revision=journal-r1", "search.n_trials=12"]
    overrides += ["+space.params.fault={type:choice,values:[none,ok,fine,raise]}", faults.TRAINER]
    res = launch(overrides, cwd=root, data_dir=data, env={STEP_HOOK_ENV: faults.HOOK})
    assert res.returncode == 0, res.stderr[-2000:]
    found = SearchDir(root / "runs" / "journal-r1")
    assert {r.state for r in found.records()} == set(OPTUNA_STATE), "the search should end with each kind of trial"
    return found


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def journal_study(path: Path):
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))
    (summary,) = storage.get_all_studies()  # one study, however many exports
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def test_the_journal_holds_every_trial_as_the_ledger_has_it_and_a_second_export_adds_nothing(search, tmp_path):
    before = tree_digest(search.path)
    out = tmp_path / "search.journal"
    first = export_journal(search, out)
    identity = search.identity()
    assert identity is not None
    assert first == JournalExport(f"journal-r1-{identity.search_id}", 12, 0, 0)
    written = out.read_bytes()
    assert export_journal(search, out) == JournalExport(first.study_name, 0, 12, 0)
    assert out.read_bytes() == written  # not a line more
    assert tree_digest(search.path) == before  # the search is only read
    assert sorted(p.name for p in tmp_path.iterdir()) == ["search.journal"]  # no lock file left behind

    study = journal_study(out)
    contract = search.contract()
    assert study.study_name == first.study_name and study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.user_attrs == {"contract_digest": contract.digest, "search_path": str(search.path), "metric": METRIC}
    assert study.metric_names == [METRIC]
    space = optuna_distributions(space_of(contract)[0])
    trials = {t.user_attrs["parcel_trial_id"]: t for t in study.trials}
    records = {r.trial_id: r for r in search.records()}
    assert sorted(trials) == sorted(records)
    assert [t.user_attrs["parcel_trial_id"] for t in study.trials] == sorted(records)  # numbered in the ledger's order
    for tid, r in records.items():
        t, events = trials[tid], search.events(tid)
        assert t.state.name == OPTUNA_STATE[r.state], tid
        assert t.value == r.metric  # None but for a completed trial
        curve = {e.data.step: e.data.value for e in events if e.kind is EventKind.MILESTONE}
        assert t.intermediate_values == curve, tid
        if r.state is TrialState.PRUNED:
            assert max(curve) == r.milestone and curve[r.milestone] == r.last_value
        if r.state is TrialState.COMPLETED:
            assert curve[max(curve)] == r.metric
        if r.state is TrialState.FAILED:
            assert t.user_attrs["cause"] == r.cause.value == "exception" and "injected fault" in t.user_attrs["error"]
        assert t.params == r.spec.params and t.distributions == {k: space[k] for k in r.spec.params}
        assert set(t.params) == set(space)  # the fault parameter too: it is in the space
        assert t.user_attrs["state"] == r.state.value and t.user_attrs["reason"] == r.reason
        assert t.user_attrs["attempts"] == len(r.attempts) and t.user_attrs["config_hash"] == r.spec.config_hash
        assert t.user_attrs["gpu_hours"] == 0.0  # the local executor grants no GPU
        assert t.datetime_start.timestamp() == pytest.approx(min(a.started for a in r.attempts), abs=1e-3)
        assert t.datetime_complete.timestamp() == pytest.approx(max(a.ended for a in r.attempts), abs=1e-3)


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_optuna_dashboard_opens_the_file_the_command_writes(search, tmp_path):
    pytest.importorskip("optuna_dashboard")
    out = tmp_path / "search.journal"
    cli = parcel_hpc(["export", str(search.path), "--to", "optuna-journal", str(out)], cwd=tmp_path)
    assert cli.returncode == 0 and "12 trials added, 0 there already, 0 not finished" in cli.stderr, cli.stderr
    exported = export_journal(search, out)  # its study name; adds nothing
    assert exported.added == 0
    port = free_port()
    exe = Path(sys.executable).parent / "optuna-dashboard"
    log = (tmp_path / "dashboard.log").open("w")
    server = subprocess.Popen(
        [str(exe), str(out), "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(None, None)
    )
    try:

        def listed():
            assert server.poll() is None, (tmp_path / "dashboard.log").read_text()[-2000:]
            try:
                return get_json(f"http://127.0.0.1:{port}/api/studies")
            except OSError:
                return None

        (study,) = wait_for(listed, 60, "optuna-dashboard to answer")["study_summaries"]
        assert study["study_name"] == exported.study_name and study["directions"] == ["minimize"]
        detail = get_json(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}")
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert detail["objective_names"] == [METRIC]
    shown = {dict((a["key"], a["value"]) for a in t["user_attrs"])["parcel_trial_id"]: t for t in detail["trials"]}
    records = {r.trial_id: r for r in search.records()}
    assert sorted(shown) == sorted(records)
    for tid, r in records.items():
        t = shown[tid]
        assert t["state"] == OPTUNA_STATE[r.state].capitalize(), tid
        assert {p["name"]: p["param_external_value"] for p in t["params"]} == {k: str(v) for k, v in r.spec.params.items()}
        steps = {e.data.step for e in search.events(tid) if e.kind is EventKind.MILESTONE}
        assert [v["step"] for v in t["intermediate_values"]] == sorted(steps)
    (best,) = detail["best_trials"]
    assert best["values"] == [min(r.metric for r in records.values() if r.metric is not None)]


def counts(done: JournalExport) -> tuple[int, int, int]:
    return done.added, done.present, done.unfinished


def test_an_unfinished_trial_waits_for_a_later_export(search, tmp_path):
    copy = SearchDir(tmp_path / "copy")
    shutil.copytree(search.path, copy.path, symlinks=True)
    tid = next(r.trial_id for r in copy.records() if r.state is TrialState.COMPLETED)
    (worker,) = copy.trial_dir(tid).glob("journal-a1-*.jsonl")
    whole = worker.read_bytes()
    worker.write_bytes(b"".join(whole.splitlines(keepends=True)[:-1]))  # its ending not yet written: it runs
    assert copy.record(tid).state is TrialState.RUNNING
    out = tmp_path / "search.journal"
    assert counts(export_journal(copy, out)) == (11, 0, 1)
    assert tid not in {t.user_attrs["parcel_trial_id"] for t in journal_study(out).trials}
    worker.write_bytes(whole)
    assert counts(export_journal(copy, out)) == (1, 11, 0)
    trials = journal_study(out).trials
    assert len(trials) == 12 and trials[-1].user_attrs["parcel_trial_id"] == tid and trials[-1].state.name == "COMPLETE"


def test_a_file_that_is_no_journal_or_a_folder_not_writable_is_one_line_and_nothing_written(search, tmp_path):
    for text in (
        b"trial,state\nt0000,completed\n",
        b'{"op_code": 0}\nnot json\n',
        b"SQLite format 3\x00",
        b'{"op_code": 0}',
        b'{"op_code": 0}\n',
        b'{"op_code": 99}\n',
    ):
        other = tmp_path / "other.db"
        other.write_bytes(text)
        with pytest.raises(UsageError, match=r"other\.db exists and is not an Optuna journal") as err:
            export_journal(search, other)
        assert err.value.exit_code == 2 and "\n" not in str(err.value)
        assert other.read_bytes() == text and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    with pytest.raises(UsageError, match=r"/proc/search\.journal: cannot be written") as err:  # /proc takes no files, even from root
        export_journal(search, Path("/proc/search.journal"))
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="its folder does not exist"):
        export_journal(search, tmp_path / "nowhere" / "search.journal")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_link_planted_after_the_check_is_never_written_through(search, tmp_path, monkeypatch):
    """The review's race: FILE passes the check, then becomes a link to a file only root may write
    before the first line is appended. The export writes only to the file it opened and judged."""
    out, secret = tmp_path / "search.journal", tmp_path / "root-only.log"
    secret.write_bytes(b"")
    secret.chmod(0o600)
    storage_init = optuna.storages.JournalStorage.__init__

    def swapped_first(self, *args, **kwargs):
        out.unlink(missing_ok=True)
        out.symlink_to(secret)
        storage_init(self, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.JournalStorage, "__init__", swapped_first)
    export_journal(search, out)
    assert secret.read_bytes() == b""
    monkeypatch.undo()
    with pytest.raises(UsageError, match="is a symbolic link"):  # a link there before the export: refused, as before
        export_journal(search, out)
    assert secret.read_bytes() == b""


def test_without_optuna_the_error_names_the_extra(search, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(UsageError, match=r"pip install 'parcel_hpc\[optuna\]'"):
        export_journal(search, tmp_path / "search.journal")
    assert not list(tmp_path.iterdir())


def test_importing_the_module_imports_no_optuna():
    code = "import sys, parcel_hpc.integrations.optuna_journal; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, check=True)
    assert out.stdout.strip() == "False"


def test_the_curve_leaves_out_what_an_attempt_in_a_quarantined_directory_reported(search):
    spec = search.spec("t0000")
    events = [
        Event(EventKind.MILESTONE, 1.0, "a1", 1, 1, Milestone(10, 0.9)),
        Event(EventKind.QUARANTINED, 2.0, "launch", 1, 0, Quarantined("shared a checkpoint directory", attempts_upto=1)),
        Event(EventKind.MILESTONE, 3.0, "a2", 1, 2, Milestone(10, 0.6)),
        Event(EventKind.MILESTONE, 4.0, "a2", 2, 2, Milestone(82, 0.5, is_milestone=False)),
    ]
    record = fold(spec, events)
    assert record.tainted_upto == 1
    assert [(m.step, m.value) for _, m in counted_milestones(record, events)] == [(10, 0.6), (82, 0.5)]
