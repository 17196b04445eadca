"""Operating searches day to day on the local executor: ``list``, ``status --watch``, ``export``,
``reconcile --root``, and hours charged only for what was allocated (real launches, real files)."""

import getpass
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from browser import check_html_plots
from rich.console import Console
from test_read_commands import read_only, tree

from parcel_hpc.budget import BudgetLedger
from parcel_hpc.commands import status
from parcel_hpc.errors import UsageError
from parcel_hpc.launch.pulse import Pulse
from parcel_hpc.ledger import Heartbeat, LauncherState, SearchDir
from parcel_hpc.ledger.searches import launcher_state
from parcel_hpc.scheduler.local.dispatcher import machine_gpus
from parcel_hpc.testing import faults, launch, parcel_hpc, runs, start_launch
from parcel_hpc.worker.training import STEP_HOOK_ENV

FAST = ["pruner=none", "train.steps=10", "checkpoint.every_steps=5"]


def run_search(tmp_path, data_dir, rev: str, *overrides: str) -> Path:
    # No GPU to hand out, whatever this machine has: the figures below are a CPU-only machine's.
    res = launch([f"search.root={tmp_path / 'runs'}", f"search.revision={rev}", *overrides], cwd=tmp_path, data_dir=data_dir, env={"CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr[-2000:]
    return tmp_path / "runs" / rev


# --- list ------------------------------------------------------------------------------------


def test_launcher_state_from_plain_values():
    now, host = 1000.0, "login1"
    launch_rec = {"launch_id": "L1", "dispatched": ["t0000"], "follows": True}
    alive = lambda pid: pid == 7  # noqa: E731
    S = LauncherState

    def state(*beats: Heartbeat, launches=(launch_rec,)) -> LauncherState:
        return launcher_state(list(launches), {f"L{i}": b for i, b in enumerate(beats)}, now, host, alive)

    assert state(launches=()) is S.NONE
    assert state(launches=[{**launch_rec, "dispatched": []}]) is S.NONE
    assert state(launches=[{"launch_id": "L0", "dispatched": ["t0"]}]) is S.UNKNOWN  # dispatched before heartbeats existed
    assert state(Heartbeat(990.0, host, 7, S.FOLLOWING)) is S.FOLLOWING
    assert state(Heartbeat(990.0, host, 8, S.FOLLOWING)) is S.GONE  # fresh, but its pid died here
    assert state(Heartbeat(990.0, "node9", 8, S.FOLLOWING)) is S.FOLLOWING  # another host: its word is all there is
    assert state(Heartbeat(800.0, "node9", 8, S.FOLLOWING)) is S.GONE  # stale: no beat for 200 s
    for last_word in (S.ENDED, S.DETACHED, S.STOPPED):
        assert state(Heartbeat(800.0, host, 7, last_word)) is last_word
    # the newest launch's word stands; any launch at work wins
    assert state(Heartbeat(700.0, host, 7, S.ENDED), Heartbeat(800.0, host, 8, S.STOPPED)) is S.STOPPED
    assert state(Heartbeat(800.0, host, 8, S.STOPPED), Heartbeat(995.0, "node9", 9, S.FOLLOWING)) is S.FOLLOWING


def test_a_pulse_beats_while_the_launch_works_and_leaves_its_last_word(tmp_path):
    search = SearchDir(tmp_path / "s")
    with Pulse(search, "L1", interval_s=0.05) as pulse:
        first = search.heartbeats()["L1"]
        assert first.state is LauncherState.FOLLOWING and first.pid == os.getpid()
        time.sleep(0.3)
        assert search.heartbeats()["L1"].at > first.at  # the thread beats on its own
        pulse.leaving(LauncherState.DETACHED)
    assert search.heartbeats()["L1"].state is LauncherState.DETACHED
    with pytest.raises(KeyboardInterrupt), Pulse(search, "L2", interval_s=0.05) as pulse:
        pulse.leaving(LauncherState.ENDED)
        raise KeyboardInterrupt  # interrupted: whatever it meant to say, it stopped
    assert search.heartbeats()["L2"].state is LauncherState.STOPPED
    with Pulse(search, "L3") as pulse:
        pulse.withdraw()  # dispatched nothing: no word
    with Pulse(search, "L4", beating=False):
        pass  # a dry run
    assert set(search.heartbeats()) == {"L1", "L2"}


def test_list_shows_every_search_under_a_root_and_writes_nothing(tmp_path, data_dir):
    done = run_search(tmp_path, data_dir, "done-r1", "search.n_trials=4", *FAST)
    dry = launch([f"search.root={tmp_path / 'runs'}", "search.revision=nothing-r1", "search.n_trials=0"], cwd=tmp_path, data_dir=data_dir)
    assert dry.returncode == 0, dry.stderr
    (tmp_path / "runs" / "not-a-search").mkdir()
    before = tree(tmp_path / "runs")
    with read_only(tmp_path / "runs"):
        out = parcel_hpc(["list", str(tmp_path / "runs"), "--json"])
        table = parcel_hpc(["list", str(tmp_path / "runs")])
    assert tree(tmp_path / "runs") == before
    assert out.returncode == 0 and table.returncode == 0, out.stderr + table.stderr
    found = {Path(s["path"]).name: s for s in json.loads(out.stdout)["searches"]}
    assert set(found) == {"done-r1", "nothing-r1"}
    s = found["done-r1"]
    assert s["revision"] == "done-r1" and s["trials"] == 4 and s["counts"]["completed"] == 4
    assert s["launcher"] == "ended" and s["best"]["trial_id"].startswith("t")
    ledger = BudgetLedger.read_totals(done)
    assert s["spend"]["parts"]["attempts"]["cpu_hours"] == pytest.approx(ledger.used_cpu_hours, abs=1e-6) and s["caps"]["gpu_hours"] == 200.0
    assert time.time() - 600 < s["last_activity"] <= time.time()
    assert found["nothing-r1"]["launcher"] == "none" and found["nothing-r1"]["trials"] == 0
    assert "done-r1" in table.stdout and "ended" in table.stdout


def test_one_damaged_search_is_listed_with_its_problem_and_hides_no_other(tmp_path, data_dir):
    good = run_search(tmp_path, data_dir, "good-r1", "search.n_trials=2", *FAST)
    bad = run_search(tmp_path, data_dir, "bad-r1", "search.n_trials=2", *FAST)
    journal = next((bad / "trials" / "t0000").glob("journal-*.jsonl"))
    journal.write_bytes(b"\xff\xfe not utf-8\n" + journal.read_bytes())  # damaged mid-file, not a torn tail
    res = parcel_hpc(["list", str(tmp_path / "runs"), "--json"])
    assert res.returncode == 0, res.stderr
    found = {Path(s["path"]).name: s for s in json.loads(res.stdout)["searches"]}
    assert found["good-r1"]["counts"]["completed"] == 2 and found["good-r1"]["problem"] == ""
    assert "not valid JSON" in found["bad-r1"]["problem"] and journal.name in found["bad-r1"]["problem"]
    assert good.exists()


def test_list_of_a_root_that_does_not_exist_is_one_line_and_exit_2(tmp_path):
    res = parcel_hpc(["list", str(tmp_path / "nowhere")])
    assert res.returncode == 2 and "is not a directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_list_says_gone_for_a_killed_launcher_and_following_for_a_live_one(tmp_path, data_dir):
    proc = start_launch(
        [f"search.root={tmp_path / 'runs'}", "search.revision=live-r1", "search.n_trials=4", "train.step_seconds=0.5", *FAST], cwd=tmp_path, data_dir=data_dir
    )
    search = SearchDir(tmp_path / "runs" / "live-r1")
    deadline = time.time() + 120
    while not search.heartbeats() and time.time() < deadline:
        time.sleep(0.2)
    listed = json.loads(parcel_hpc(["list", str(tmp_path / "runs"), "--json"]).stdout)["searches"][0]
    assert listed["launcher"] == "following"
    proc.send_signal(signal.SIGKILL)  # no last word: its heartbeat stays "following" while its pid is gone
    proc.wait(30)
    listed = json.loads(parcel_hpc(["list", str(tmp_path / "runs"), "--json"]).stdout)["searches"][0]
    assert listed["launcher"] == "gone"


# --- status --watch ----------------------------------------------------------------------------


def test_watch_prints_one_line_per_change_and_exits_when_the_search_ends(tmp_path, data_dir):
    root = tmp_path / "runs"
    proc = start_launch([f"search.root={root}", "search.revision=w-r1", "search.n_trials=3", "train.step_seconds=0.3", *FAST], cwd=tmp_path, data_dir=data_dir)
    search = root / "w-r1"
    deadline = time.time() + 120
    while not (search / "trials").exists() and time.time() < deadline:
        time.sleep(0.1)
    watched = parcel_hpc(["status", str(search), "--watch", "--interval", "0.3"], timeout=300)  # a pipe, not a terminal: lines
    assert proc.wait(300) == 0
    assert watched.returncode == 0, watched.stderr
    lines = watched.stdout.splitlines()
    assert any(" t0000 running" in line for line in lines)  # seen while it ran
    assert any(" t0000 completed miss-cost " in line and "milestones 1/1" in line for line in lines)
    assert lines[-1].split(" ", 1)[1].startswith("completed=3 (total 3)")


def test_watch_on_a_terminal_draws_a_live_view(tmp_path, data_dir):
    search = run_search(tmp_path, data_dir, "t-r1", "search.n_trials=2", *FAST)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=150, height=40)
    assert status.watch(SearchDir(search), console, interval_s=0.1) == 0
    text = screen.getvalue()
    assert "launcher: ended" in text and "best so far: t000" in text and "completed=2 (total 2)" in text


def test_watch_says_stalled_when_nothing_can_move_the_search(tmp_path, data_dir):
    root = tmp_path / "runs"
    proc = start_launch(
        [f"search.root={root}", "search.revision=s-r1", "search.n_trials=6", "train.step_seconds=0.3", "hydra.launcher.parallelism=1", *FAST],
        cwd=tmp_path,
        data_dir=data_dir,
    )
    search = SearchDir(root / "s-r1")
    deadline = time.time() + 120
    while not (search.trials_dir.exists() and any(r.state.value == "completed" for r in search.records())):
        assert time.time() < deadline, "no trial completed"
        time.sleep(0.2)
    workers = runs.descendants(proc.pid)  # its workers die with it, as on a lost login node
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    _kill(workers)
    watched = parcel_hpc(["status", str(search.path), "--watch", "--interval", "0.2"], timeout=120)
    assert watched.returncode == 4, watched.stdout + watched.stderr
    assert "stalled:" in watched.stdout and "launcher: gone" in watched.stdout


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)


# --- export ----------------------------------------------------------------------------------


def test_export_gives_pandas_typed_rows_per_trial_and_per_attempt(tmp_path, data_dir):
    search = run_search(tmp_path, data_dir, "x-r1", "search.n_trials=5", "pruner=none", "train.steps=12", "checkpoint.every_steps=4")
    before = tree(search)
    paths = {}
    for fmt in ("csv", "parquet", "jsonl"):
        paths[fmt] = tmp_path / f"trials.{fmt}"
        res = parcel_hpc(["export", str(search), "--format", fmt, "--output", str(paths[fmt])])
        assert res.returncode == 0, res.stderr
    attempts_csv = tmp_path / "attempts.csv"
    assert parcel_hpc(["export", str(search), "--attempts", "-o", str(attempts_csv)]).returncode == 0
    assert tree(search) == before  # it only read
    pq = pd.read_parquet(paths["parquet"])
    csv = pd.read_csv(paths["csv"], parse_dates=["started_at", "ended_at"])
    jl = pd.read_json(paths["jsonl"], lines=True)
    assert len(pq) == len(csv) == len(jl) == 5
    assert (pq["proposed_by"] == "random").all() and pq["proposal"].isna().all()  # lineage: drawn from (seed, index)
    records = {r.trial_id: r for r in SearchDir(search).records()}
    for frame in (pq, csv):
        assert list(frame["trial_id"]) == sorted(records)
        assert frame["attempts"].dtype == "int64" and frame["milestones_reached"].dtype == "int64"
        assert frame["final_metric"].dtype == "float64" and frame["gpu_hours"].dtype == "float64"
        assert frame["params_hidden"].dtype == "int64" and frame["params_lr"].dtype == "float64"
        assert str(frame["started_at"].dtype).startswith("datetime64") and frame["started_at"].dt.tz is not None
        for row in frame.itertuples():
            rec = records[row.trial_id]
            assert row.final_metric == pytest.approx(rec.metric) and row.state == rec.state.value
            assert row.best_metric <= row.final_metric and row.milestones_reached == 1  # pruner=none: one milestone, the last step
            assert row.params_lr == rec.spec.params["lr"] and row.attempts == len(rec.attempts)
            assert row.train_loss == rec.train_metrics["loss"] and row.metric_resume == rec.metric_resume.value  # the class form's step() metrics too
            assert row.gpu_hours == 0.0  # the local executor allocates no GPU on a machine without one
            assert row.cpu_hours > 0 and row.cost > 0 and row.queue_wait_s >= 0
    # the budget journal keeps whole micro-hours: each settled attempt rounds by up to half of one
    assert pq["cpu_hours"].sum() == pytest.approx(BudgetLedger.read_totals(search).used_cpu_hours, abs=1e-6 * pq["attempts"].sum())
    per_attempt = pd.read_csv(attempts_csv)
    assert len(per_attempt) == sum(len(r.attempts) for r in records.values())
    assert per_attempt["attempt"].dtype == "int64" and per_attempt["wall_s"].dtype == "float64" and (per_attempt["gpus"] == 0).all()


def test_export_refuses_an_output_it_cannot_write_before_reading_anything(tmp_path):
    for output, says in ((tmp_path / "missing" / "t.csv", "its folder does not exist"), (tmp_path, "is a directory")):
        res = parcel_hpc(["export", str(tmp_path / "no-search"), "-o", str(output)])
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_parameter_of_mixed_kinds_exports_as_json_text_and_others_keep_their_type():
    from parcel_hpc.accounting.trials import _param_column

    assert _param_column([64, "auto"]).to_pylist() == ["64", '"auto"']
    assert _param_column([True, 0]).to_pylist() == ["true", "0"]
    assert _param_column([[1, 2], None]).to_pylist() == ["[1, 2]", None]
    assert str(_param_column([None, 16]).type) == "int64" and str(_param_column([0.1, 1]).type) == "double"


def test_export_of_a_requeued_trial_counts_each_attempt(tmp_path, data_dir):
    """One trial sent SLURM's checkpoint signal at step 6: two attempts, both in --attempts, the
    second resumed from step 6; the trial's row adds their hours."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {STEP_HOOK_ENV: faults.INTERRUPT_HOOK, faults.INTERRUPT_STEP_ENV: "6", faults.MARKERS_ENV: str(markers)}
    res = launch(
        [f"search.root={tmp_path / 'runs'}", "search.revision=rq-r1", "search.n_trials=1", "pruner=none", "train.steps=12", "checkpoint.every_steps=3"],
        cwd=tmp_path,
        data_dir=data_dir,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    search = tmp_path / "runs" / "rq-r1"
    rows = _csv(parcel_hpc(["export", str(search), "--attempts"]).stdout)
    assert [r["attempt"] for r in rows] == ["1", "2"] and rows[0]["how"] == "interrupted" and rows[1]["resumed_from"] == "6", rows
    assert rows[1]["how"] == "completed" and rows[1]["metric"] != "" and rows[0]["metric"] == ""
    trial = _csv(parcel_hpc(["export", str(search)]).stdout)[0]
    assert trial["attempts"] == "2" and trial["interrupted"] == "1" and trial["state"] == "completed"
    assert float(trial["cpu_hours"]) == pytest.approx(sum(float(r["cpu_hours"]) for r in rows))


def _csv(text: str) -> list[dict]:
    import csv

    return list(csv.DictReader(io.StringIO(text)))


# --- hours only for what was allocated --------------------------------------------------------


def test_local_trials_get_distinct_gpus_where_the_machine_has_them(tmp_path, data_dir):
    """With CUDA_VISIBLE_DEVICES=0,1 (two GPUs to hand out) and one GPU a trial, two trials run at
    once, each on its own device, charged one GPU each; the same search on a machine without GPUs
    is charged none."""
    overrides = [f"search.root={tmp_path / 'runs'}", "search.n_trials=4", "resources.gpus=1", "train.step_seconds=0.2", "hydra.launcher.pack_size=1", *FAST]
    res = launch([*overrides, "search.revision=g-r1"], cwd=tmp_path, data_dir=data_dir, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert res.returncode == 0, res.stderr[-2000:]
    spans = []
    for tid in SearchDir(tmp_path / "runs" / "g-r1").trial_ids():
        for e in SearchDir(tmp_path / "runs" / "g-r1").events(tid):
            if e.kind.value == "started":
                assert e.data.gpus == 1 and e.data.cuda_visible_devices in ("0", "1")
                rec = SearchDir(tmp_path / "runs" / "g-r1").record(tid)
                spans.append((rec.attempts[0].started, rec.attempts[0].ended, e.data.cuda_visible_devices))
    overlapping = [(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, spans  # two devices: trials ran side by side
    assert all(a[2] != b[2] for a, b in overlapping), overlapping  # and never on one device
    used = BudgetLedger.read_totals(tmp_path / "runs" / "g-r1")
    assert used.used_gpu_hours == pytest.approx(used.used_cpu_hours, rel=1e-6) and used.used_gpu_hours > 0  # 1 CPU and 1 GPU a trial
    res = launch([*overrides, "search.revision=c-r1"], cwd=tmp_path, data_dir=data_dir, env={"CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stderr[-2000:]
    assert BudgetLedger.read_totals(tmp_path / "runs" / "c-r1").used_gpu_hours == 0.0
    shown = json.loads(parcel_hpc(["status", str(tmp_path / "runs" / "c-r1"), "--json"]).stdout)
    assert shown["spend"]["gpu_hours"] == 0.0 and shown["spend"]["cpu_hours"] > 0
    recon = json.loads(parcel_hpc(["reconcile", str(tmp_path / "runs" / "c-r1"), "--json"]).stdout)["campaigns"][0]
    assert recon["figures"]["gpu_hours"] == 0.0 and recon["figures"]["cpu_hours"] > 0


def test_the_machines_gpus_are_numbered_devices_or_a_one_line_refusal():
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}) == (0, 2)
    assert machine_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()  # none to hand out: trials run on the CPU
    with pytest.raises(UsageError, match="names GPUs by UUID or MIG id"):
        machine_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f3c2a10-1d2e-4b5f-9a6b-0c1d2e3f4a5b"})


# --- reconcile --root ------------------------------------------------------------------------


def test_reconcile_over_a_root_totals_every_search_by_user_search_and_partition(tmp_path, data_dir):
    a = run_search(tmp_path, data_dir, "a-r1", "search.n_trials=3", *FAST)
    b = run_search(tmp_path, data_dir, "b-r1", "search.n_trials=2", *FAST)
    html = tmp_path / "account.html"
    before = tree(tmp_path / "runs")
    out = parcel_hpc(["reconcile", "--root", str(tmp_path / "runs"), "--json", "--html", str(html)])
    assert out.returncode == 0, out.stderr
    assert tree(tmp_path / "runs") == before
    report = json.loads(out.stdout)
    singles = [json.loads(parcel_hpc(["reconcile", str(s), "--json"]).stdout)["campaigns"][0] for s in (a, b)]
    assert report["complete"] and {Path(s["path"]).name for s in report["searches"]} == {"a-r1", "b-r1"}
    assert report["totals"]["cpu_hours"] == pytest.approx(sum(s["figures"]["cpu_hours"] for s in singles))
    assert [u["key"] for u in report["by_user"]] == [getpass.getuser()]
    assert {p["key"] for p in report["by_partition"]} == {"local"}
    assert {Path(s["key"]).name for s in report["by_search"]} == {"a-r1", "b-r1"}
    assert report["unknown_jobs"] == []
    csv_rows = _csv(parcel_hpc(["reconcile", "--root", str(tmp_path / "runs"), "--csv"]).stdout)
    assert sum(float(r["cpu_hours"]) for r in csv_rows) == pytest.approx(report["totals"]["cpu_hours"])
    check_html_plots(html, tmp_path, at_least=4, sections=('id="by-user"', 'id="by-search"', 'id="by-partition"', 'id="searches"'))


def test_reconcile_many_refuses_mixed_or_incomplete_arguments(tmp_path):
    for args, says in (
        (["reconcile"], "needs SEARCH_DIR"),
        (["reconcile", "--account", "parcel"], "--account needs --since"),
        (["reconcile", "--root", str(tmp_path), "--since", "2026-01-01"], "--since goes with --account"),
        (["reconcile", "--account", "parcel", "--since", "yesterday"], "is not a date"),
        (["reconcile", str(tmp_path), "--root", str(tmp_path)], "give no SEARCH_DIR"),
    ):
        res = parcel_hpc(args)
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
