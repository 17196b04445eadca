"""Checkpoints, quarantine, failure classification and dedup end to end on the local executor,
with real concurrent processes and real signals."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from disks import fill, small_tmpfs
from reference import reference_run

from parcel_hpc.budget import BudgetLedger, KeyState, ReservationKey
from parcel_hpc.ledger import SearchDir, read_events
from parcel_hpc.testing import faults, launch, parcel_hpc
from parcel_hpc.testing.runs import subprocess_env, wait_for, with_suite_cadence
from parcel_hpc.worker.training import STEP_HOOK_ENV


def run(tmp_path, data_dir, rev, *overrides, **kw):
    kw.setdefault("env", {STEP_HOOK_ENV: faults.HOOK})  # +space.params.fault=... injects faults through the step hook
    return launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *with_suite_cadence(overrides)], cwd=tmp_path, data_dir=data_dir, **kw)


def launch_argv(tmp_path, rev, *overrides) -> list[str]:
    """The launch command line, for tests that start it themselves (to kill it, race it, set its umask)."""
    return [sys.executable, "-m", "parcel_hpc.launch", "-m", f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *with_suite_cadence(overrides)]


def sd(tmp_path, rev) -> SearchDir:
    return SearchDir(tmp_path / "runs" / rev)


def reference(tmp_path, data_dir, n=1) -> list[float]:
    res = run(tmp_path, data_dir, "reference", f"search.n_trials={n}", "pruner=none")
    assert res.returncode == 0, res.stderr
    return [r.metric for r in sd(tmp_path, "reference").records()]


def test_two_trials_on_one_prefix_are_quarantined_and_rerun_clean(tmp_path, data_dir):
    res = run(
        tmp_path, data_dir, "shared", "search.n_trials=2", "pruner=none", "checkpoint.prefix=shared", "train.step_seconds=0.03", "hydra.launcher.parallelism=2"
    )
    assert res.returncode == 0, res.stderr
    records = list(sd(tmp_path, "shared").records())
    assert [r.state.value for r in records] == ["completed", "completed"]
    for r in records:
        assert r.quarantines and "shared" in r.quarantines[0]  # both were quarantined...
        assert r.attempts[-1].number > 1 and r.invalid_metrics
    # ...their outputs were moved aside, not deleted, and the reruns used fresh directories
    moved = list((tmp_path / "runs" / "shared" / "quarantine").glob("t000?_t000?-*"))
    assert moved and any(moved[0].rglob("claim-*.json"))
    assert len(list((tmp_path / "runs" / "shared" / "checkpoints-clean").iterdir())) == 2
    # the clean reruns reach exactly the metrics of trials that never shared anything
    assert [r.metric for r in records] == reference(tmp_path, data_dir, 2)


def test_killed_worker_resumes_from_its_last_good_checkpoint(tmp_path, data_dir):
    argv = launch_argv(tmp_path, "killed", "search.n_trials=1", "pruner=none", "train.step_seconds=0.08", "checkpoint.keep_last=3")
    launcher = subprocess.Popen(
        argv, cwd=tmp_path, env={**subprocess_env(data_dir, None)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    ckpt_dir = tmp_path / "runs" / "killed" / "checkpoints" / "t0000"
    wait_for(lambda: len(list(ckpt_dir.glob("ckpt-*.h5"))) >= 3, 60, "three checkpoints")
    started = [e.to_json() for e in sd(tmp_path, "killed").events("t0000") if e.kind.value == "started"][-1]
    # Kill everything at once, launcher and worker: nobody is left to say how the attempt ended.
    os.killpg(launcher.pid, signal.SIGKILL)
    os.kill(started["pid"], signal.SIGKILL)
    launcher.wait()
    wait_for(lambda: not os.path.exists(f"/proc/{started['pid']}"), 10, "the worker to be gone")
    files = sorted(ckpt_dir.glob("ckpt-*.h5"))
    newest, previous = files[-1], files[-2]
    with open(newest, "r+b") as f:  # and the newest checkpoint is damaged on disk
        f.truncate(newest.stat().st_size // 2)
    st = json.loads(parcel_hpc(["status", str(tmp_path / "runs" / "killed"), "--json"]).stdout)
    assert st["trials"][0]["state"] == "queued"  # resolved from the process table, not left running
    assert "lost" in st["trials"][0]["reason"]
    res = parcel_hpc(["resubmit", str(tmp_path / "runs" / "killed")])
    assert res.returncode == 0, res.stderr
    rec = sd(tmp_path, "killed").record("t0000")
    assert rec.state.value == "completed", (rec.state, rec.reason)
    assert rec.attempts[0].how.value == "lost" and rec.attempts[1].resumed_from == int(previous.stem.split("-")[1])
    # The lost attempt's hold was settled with the hours the ledger saw it run: nothing stays held.
    view = BudgetLedger.read(tmp_path / "runs" / "killed")
    assert view.totals.reserved_cpu_hours == 0 and {h.state for h in view.holds.values()} == {KeyState.SETTLED}
    lost = view.holds[ReservationKey("t0000", 1)]
    assert lost.used_cpu_hours == pytest.approx(rec.attempts[0].hours() * int(rec.spec.resources["cpus"]), abs=1e-6)
    skipped = [e.to_json() for e in sd(tmp_path, "killed").events("t0000") if e.kind.value == "checkpoint_skipped"]
    assert skipped and skipped[0]["path"].endswith(newest.name)
    assert rec.metric == reference(tmp_path, data_dir)[0]


def test_reproducible_failure_is_tried_twice_then_failed(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "boom", "search.n_trials=1", "+space.params.fault={type:choice,values:[raise]}", faults.TRAINER)
    assert res.returncode == 3 and "hold:no-result" in res.stdout, res.stderr  # nothing completed: no result
    rec = sd(tmp_path, "boom").record("t0000")
    assert rec.state.value == "failed" and rec.reason == "exception" and rec.error == "RuntimeError: injected fault: params.fault=raise"
    assert rec.failures == ("exception", "exception") and len(rec.attempts) == 2
    assert "failed=1" in res.stdout  # counted in the summary, never dropped
    again = run(tmp_path, data_dir, "boom", "search.n_trials=1", "+space.params.fault={type:choice,values:[raise]}", faults.TRAINER)
    assert again.returncode == 3 and "1 already finished" in again.stdout and "hold:no-result" in again.stdout
    assert len(sd(tmp_path, "boom").record("t0000").attempts) == 2  # not retried again


def test_divergence_is_its_own_failure_class(tmp_path, data_dir):
    res = run(tmp_path, data_dir, "nan", "search.n_trials=1", "+space.params.fault={type:choice,values:['nan']}", faults.TRAINER)
    assert res.returncode == 3 and "hold:no-result" in res.stdout, res.stderr
    rec = sd(tmp_path, "nan").record("t0000")
    assert rec.state.value == "failed" and rec.reason == "diverged"


def test_duplicates_are_dispatched_once_even_by_two_concurrent_launchers(tmp_path, data_dir):
    argv = launch_argv(tmp_path, "dedup", "space=tiny_r1", "search.n_trials=12", "pruner=none", "train.step_seconds=0.01")
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-500:] for o in outs]
    search = sd(tmp_path, "dedup")
    launches = search.launches()
    assert len(launches) == 2
    distinct = {json.dumps(search.spec(t).params, sort_keys=True) for t in search.trial_ids()}
    assert len(distinct) == len(search.trial_ids()) <= 6  # one trial per effective configuration
    for l in launches:
        assert len(l["duplicates"]) == 12 - len(distinct)
        for dup, twin in l["duplicates"].items():
            assert twin in search.trial_ids() and dup not in search.trial_ids()
    for tid in search.trial_ids():
        assert search.dispatch_count(tid) == 1
        assert len(search.record(tid).attempts) == 1 and search.record(tid).state.value == "completed"
    dispatched = sorted(t for l in launches for t in l["dispatched"])
    assert dispatched == sorted(search.trial_ids())  # split between the launchers, none twice


def test_two_launchers_that_decided_at_once_cannot_both_claim_a_dispatch(tmp_path):
    """The race the 500-trial load case found: both saw no dispatch and decided to dispatch; the
    second must not take dispatch 2 because the first took 1. Many processes race here for real."""
    search = SearchDir(tmp_path / "search")
    search.trial_dir("t0000").mkdir(parents=True)
    code = (
        "import sys; from pathlib import Path; from parcel_hpc.ledger import SearchDir; "
        "s = SearchDir(Path(sys.argv[1])); print(s.claim_dispatch('t0000', sys.argv[2], 0))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(search.path), f"launch-{i}"], stdout=subprocess.PIPE, text=True, env=subprocess_env(None, None))
        for i in range(8)
    ]
    won = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(won) == ["1"] + ["None"] * 7, won
    assert search.dispatch_count("t0000") == 1
    assert search.claim_dispatch("t0000", "later", 1) == 2  # a later decision, on the count it saw, takes the next


def test_nothing_in_the_search_is_group_or_world_writable_even_under_umask_0(tmp_path, data_dir):
    argv = launch_argv(tmp_path, "umask", "search.n_trials=2", f"checkpoint.dir={tmp_path / 'shared-ckpt'}")
    proc = subprocess.run(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), capture_output=True, text=True, preexec_fn=lambda: os.umask(0))
    assert proc.returncode == 0, proc.stderr
    made = list((tmp_path / "runs").rglob("*")) + list((tmp_path / "shared-ckpt").rglob("*")) + [tmp_path / "shared-ckpt"]
    assert len(made) > 50
    writable = [str(p) for p in made if os.stat(p).st_mode & 0o022]  # nor by the group: it could replace a pickle
    assert writable == []


def test_full_disk_on_the_checkpoint_root(tmp_path, data_dir):
    """The checkpoint filesystem is full: every attempt is an infrastructure interruption
    (no_space), retried within the budget and then given up, never a failure of the design;
    nothing half-written is left behind."""
    with small_tmpfs(tmp_path / "small", "8k") as root:  # a claim fits, a checkpoint does not
        res = run(tmp_path, data_dir, "full", "search.n_trials=1", "pruner=none", f"checkpoint.dir={root}")
        leftovers = [p.name for p in root.rglob("*") if p.name.endswith(".tmp")]
    assert res.returncode == 3 and "hold:no-result" in res.stdout, res.stderr  # given up: no result
    rec = sd(tmp_path, "full").record("t0000")
    assert rec.state.value == "failed" and rec.cause.value == "retries_exhausted", (rec.state, rec.reason)
    assert rec.failures == () and rec.metric is None  # no failure class: the design was never judged
    assert [(a.how.value, a.cause.value) for a in rec.attempts] == [("interrupted", "no_space")] * 3
    assert "No space left on device" in rec.attempts[0].message
    assert leftovers == []


def test_a_full_search_root_mid_search_is_one_line_and_the_relaunch_finishes_it(tmp_path, data_dir):
    """The search root is a small tmpfs that fills while trials run: the launch leaves in one line
    (exit 2) naming the full filesystem and the fix, every record it wrote still reads, and the same
    command, once space is freed, finishes every trial to the metric an uninterrupted run gives."""
    with small_tmpfs(tmp_path / "small", "32m") as small:
        argv = [*launch_argv(small, "full-r1", "search.n_trials=2", "pruner=none", "train.step_seconds=0.02")]
        launcher = subprocess.Popen(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        search = sd(small, "full-r1")
        wait_for(lambda: any(search.path.joinpath("checkpoints").rglob("ckpt-*.h5")), 300, "a first checkpoint")
        filler = fill(small)
        _, err = launcher.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.strip()]
        assert launcher.returncode == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert "No space left on device" in lines[0] and "free space there and rerun the same command" in lines[0], lines
        shown = parcel_hpc(["status", str(search.path), "--json"])  # nothing damaged: every record reads
        assert shown.returncode == 0 and sum(json.loads(shown.stdout)["counts"].values()) == 2, shown.stderr
        filler.unlink()
        res = subprocess.run(argv, cwd=tmp_path, env=subprocess_env(data_dir, None), capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr
        records, steps = search.records(), int(search.contract()["train"]["steps"])
    assert [r.state.value for r in records] == ["completed", "completed"]
    assert any(a.cause is not None and a.cause.value == "no_space" for r in records for a in r.attempts), "the disk filled after every trial ended"
    same = reference_run("parcel_hpc.trainer.numpy_mlp:NumpyMLP", data_dir / "parcels.h5", data_dir / "split-group_r8.json")
    assert [r.metric for r in records] == [same(r.spec.params, steps) for r in records]


def test_sigkill_during_a_journal_append(tmp_path):
    """A writer killed at any moment of its appends leaves a journal every reader folds: each
    whole line is an event, nothing after the kill, nothing invented."""
    code = (
        "import sys; from pathlib import Path; from parcel_hpc.ledger import TrialWriter\n"
        "w = TrialWriter(Path(sys.argv[1]), 'a1')\n"
        "print('ready', flush=True)\n"
        "for i in range(1, 100000): w.milestone(1, i, 1.0 / i, False)\n"
    )
    for delay in (0.05, 0.2, 0.4):
        d = tmp_path / f"after-{delay}"
        p = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        wait_for(lambda d=d: list(d.glob("journal-*.jsonl")), 10, "the journal")
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        (journal,) = d.glob("journal-*.jsonl")
        data = journal.read_bytes()
        whole = data.count(b"\n")
        steps = [e.data.step for e in read_events(d)]
        assert steps == list(range(1, whole + 1)), (delay, whole, steps[-3:])


def test_torn_last_line_in_every_append_only_record(tmp_path, data_dir):
    """Every trial journal of a finished search loses half of its last line (a writer cut off on a
    shared filesystem): readers still fold each trial to exactly one state, a trial whose ending was
    torn is not scored, and the next launch finishes it to the metric it had."""
    res = run(tmp_path, data_dir, "torn", "search.n_trials=3", "pruner=none")
    assert res.returncode == 0, res.stderr
    search = sd(tmp_path, "torn")
    metrics = {r.trial_id: r.metric for r in search.records()}
    journals = sorted(search.trials_dir.glob("*/journal-*.jsonl"))
    assert len(journals) >= 6
    for journal in journals:
        data = journal.read_bytes()
        last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        journal.write_bytes(data[: len(data) - 1 - len(last) // 2])  # half of the last line, no newline
    st = parcel_hpc(["status", str(search.path), "--json"])
    assert st.returncode == 0, st.stderr
    shown = {t["trial_id"]: t for t in json.loads(st.stdout)["trials"]}
    assert all(t["state"] != "completed" and t["metric"] is None for t in shown.values())  # each lost its ending
    again = run(tmp_path, data_dir, "torn", "search.n_trials=3", "pruner=none")
    assert again.returncode == 0, again.stderr
    records = list(search.records())
    assert {r.state.value for r in records} == {"completed"}
    assert {r.trial_id: r.metric for r in records} == metrics  # resumed from their final checkpoints
