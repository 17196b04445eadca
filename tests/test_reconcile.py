"""Reconciling the ledger with recorded sacct output: every job run to the second, flags, waste."""

import json
from importlib import resources
from pathlib import Path

import pytest
from browser import check_html_plots

from parcel_hpc import fsio
from parcel_hpc.accounting.reconcile import FlagKind, reconcile
from parcel_hpc.accounting.search_report import cap_on_scale
from parcel_hpc.budget import BudgetCaps, Rates
from parcel_hpc.governance.contract import Contract, freeze_contract
from parcel_hpc.ledger import Event, SearchDir, TrialSpec, fold
from parcel_hpc.plotting import hbars
from parcel_hpc.scheduler.slurm.runs import sacct_runs
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct
from parcel_hpc.testing import parcel_hpc

SAMPLES = Path(resources.files("parcel_hpc.testing") / "samples")
CAPS = BudgetCaps(max_trials=82, gpu_hours_cap=1.0, cost_cap=10.0, rates=Rates(per_gpu_hour=2.0, per_cpu_hour=0.5))


def sample(*names) -> bytes:
    return b"".join((SAMPLES / n).read_bytes() for n in names)


def spec(tid):
    return TrialSpec(tid, int(tid[1:]), {"lr": 0.1}, 1, "sha256:" + tid[1:].rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, {"gpus": 2, "cpus": 1})


def ev(kind, t, **kw):
    defaults = {"executor": "slurm", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": t, **defaults, **kw})


PREEMPTED_THEN_DONE = [
    ev("submitted", 1, job_id="12"),
    ev("started", 2, attempt=1, job_id="12"),
    ev("ended", 3, attempt=1, how="interrupted", cause="preempted", step=20),
    ev("started", 4, attempt=2, job_id="12"),
    ev("ended", 5, attempt=2, how="completed", metric=0.3, step=82),
]
STILL_RUNNING = [ev("submitted", 1, job_id="24"), ev("started", 2, attempt=1, job_id="24")]


def test_requeued_job_reconciles_to_the_second_with_waste_by_cause():
    runs = sacct_runs(parse_sacct(sample("requeue_duplicates.txt")))
    rec = reconcile("s1", "miss-cost-r3", "test", [fold(spec("t0001"), PREEMPTED_THEN_DONE)], runs, [], CAPS)
    assert [(a.run, a.state, a.elapsed_s, a.ledger_attempt) for a in rec.attempts] == [(0, "REQUEUED", 4, 1), (1, "COMPLETED", 20, 2)]
    assert rec.flags == ()
    assert rec.attempts[0].gpu_hours == pytest.approx(2 * 4 / 3600) and rec.attempts[1].gpu_hours == pytest.approx(2 * 20 / 3600)
    assert rec.waste_hours["preemption"] == pytest.approx(2 * 4 / 3600)
    assert rec.trials[0].wall_s == 24 and rec.trials[0].effective
    assert rec.trials[0].queue_wait_s == (1, 69)  # Submit -> Start of every run (Submit resets on requeue)
    assert rec.figures["cost"] == pytest.approx(2.0 * 2 * 24 / 3600 + 0.5 * 24 / 3600)
    assert rec.scheduler["gpu_hours"]["left"] == pytest.approx(1.0 - 2 * 24 / 3600)


def test_flags_running_but_ended_mismatch_and_orphans():
    runs = sacct_runs(parse_sacct(sample("node_fail.txt")))
    mine = [a for a in runs if a.job_id == "24"]
    orphans = [a for a in runs if a.job_id == "48"]
    rec = reconcile("s1", "m", "test", [fold(spec("t0002"), STILL_RUNNING)], mine, orphans, CAPS)
    flags = list(rec.all_flags())
    # The recorded job was allocated 4 GPUs where this spec asks for 2: sacct charges more than the spend counts.
    assert sorted(f.kind for f in flags) == ["attempt_mismatch", "hours_mismatch", "orphan", "running_but_ended"] and rec.flag_count == 4
    orphan = next(f for f in flags if f.kind is FlagKind.ORPHAN)
    assert (orphan.job_id, orphan.detail) == (
        "48",
        f"job 48 ({orphans[0].state.text}, {orphans[0].node_list}) runs under the search's name but the ledger does not know it",
    )
    assert next(f for f in flags if f.kind is FlagKind.RUNNING_BUT_ENDED).detail.endswith("NODE_FAIL")
    assert rec.waste_hours["node_failure"] == pytest.approx(4 * 2 / 3600)


def test_a_run_the_worker_has_not_reported_yet_is_pending_then_a_mismatch():
    """Run 1 of job 24 started in sacct; the ledger has heard only of attempt 1: lag for five
    minutes (pending, no flag), a mismatch after that."""
    runs = sacct_runs(parse_sacct(sample("node_fail.txt")))
    mine = [a for a in runs if a.job_id == "24"]
    started = max(a.start for a in mine)
    fresh = reconcile("s1", "m", "test", [fold(spec("t0002"), STILL_RUNNING)], mine, [], CAPS, now=started + 10)
    assert "attempt_mismatch" not in {f.kind for f in fresh.flags} and not fresh.complete
    assert [(p.job_id, p.detail) for p in fresh.pending] == [("24", "not yet told: run 1 started moments ago and its worker has not said so yet")]
    late = reconcile("s1", "m", "test", [fold(spec("t0002"), STILL_RUNNING)], mine, [], CAPS, now=started + 3600)
    assert "attempt_mismatch" in {f.kind for f in late.flags}
    assert [p.detail for p in late.pending] == ["the scheduler still has job 24 RUNNING: its hours are not final"]  # still pending: it runs
    assert json.loads(b"".join(late.json_chunks()))["complete"] is False


def test_a_job_sacct_has_not_filed_is_pending_within_the_grace_then_unknown():
    done = [ev("submitted", 1, job_id="99"), ev("started", 100, attempt=1, job_id="99"), ev("ended", 200, attempt=1, how="completed", metric=0.3, step=82)]
    record = fold(spec("t0004"), done)
    fresh = reconcile("s1", "m", "test", [record], [], [], CAPS, now=260)
    assert [(p.job_id, p.detail) for p in fresh.pending] == [("99", "the scheduler has filed no record of this job yet")] and fresh.flags == ()
    late = reconcile("s1", "m", "test", [record], [], [], CAPS, now=200 + 3600)
    assert late.complete and [f.kind for f in late.flags] == ["unknown_to_scheduler"]
    dump = reconcile("s1", "m", "test", [record], [], [], CAPS)  # an exported dump: no clock to judge lag by
    assert dump.complete and [f.kind for f in dump.flags] == ["unknown_to_scheduler"]


def test_a_finished_filed_search_is_complete():
    runs = sacct_runs(parse_sacct(sample("requeue_duplicates.txt")))
    rec = reconcile("s1", "m", "test", [fold(spec("t0001"), PREEMPTED_THEN_DONE)], runs, [], CAPS, now=2e9)
    assert rec.complete and rec.pending == () and json.loads(b"".join(rec.json_chunks()))["pending"] == []


def test_state_mismatch_is_flagged():
    events = [ev("submitted", 1, job_id="12"), ev("started", 2, attempt=1, job_id="12"), ev("ended", 3, attempt=1, how="completed", metric=0.2, step=82)]
    runs = sacct_runs(parse_sacct(sample("requeue_duplicates.txt")))
    rec = reconcile("s1", "m", "test", [fold(spec("t0003"), events)], runs, [], CAPS)
    # Run 1 started after the ledger's one attempt had completed the trial: a run after finish, not a missing attempt.
    assert sorted(f.kind for f in rec.flags) == ["run_after_finish", "state_mismatch"]


def _search(tmp_path) -> SearchDir:
    fields = {
        "snapshot_digest": "sha256:" + "a" * 64,
        "split_digest": "sha256:" + "b" * 64,
        "split_method": "group",
        "metric_revision": "miss-cost-r3",
        "search_revision": "s1",
        "image_digest": "sha256:" + "i" * 64,
        "budget": {"max_trials": 82, "gpu_hours_cap": 1.0, "cost_cap": 10.0, "rate_per_gpu_hour": 2.0, "rate_per_cpu_hour": 0.5},
        "pruner": {"milestones": [10, 20, 41, 82]},
    }
    sd = SearchDir(tmp_path / "s1")
    freeze_contract(sd.path, Contract(fields))
    for tid, events in (("t0001", PREEMPTED_THEN_DONE),):
        sd.write_spec(spec(tid))
        for e in events:  # a journal as a worker and a launch would have left it
            fsio.append_jsonl(sd.trial_dir(tid) / "journal-w.jsonl", e.to_json())
    sd.write_launch("l1", {"launcher": {"kind": "slurm", "params": {"job_name": "parcel-s1"}}})
    return sd


def test_cli_reads_an_exported_dump_in_every_format(tmp_path):
    sd = _search(tmp_path)
    dump = tmp_path / "dump.txt"
    dump.write_bytes(sample("requeue_duplicates.txt", "timeout.txt"))
    res = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump), "--json"])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)["campaigns"][0]
    assert out["source"].startswith("sacct-file:") and out["counts"]["completed"] == 1
    assert [f["kind"] for f in out["flags"]] == ["orphan"]  # job 7 is in the dump, not in the ledger
    csv = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump), "--csv"])
    assert csv.stdout.splitlines()[0].startswith("campaign,trial_id,job_id,run,state") and len(csv.stdout.splitlines()) == 4
    html = tmp_path / "report.html"
    table = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump), "--html", str(html)])
    assert table.returncode == 0 and "orphan" in table.stdout
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 4 and "http" not in page.replace("http-equiv", "")
    check_html_plots(html, tmp_path, at_least=4)


def test_spend_tiny_against_its_cap_stays_readable():
    """A spend of 0.001 GPU-h against a cap of 200 would be a flat line at the axis: the search's
    plot says the cap in words, and the account report's bars use an axis fitted to the largest."""
    assert cap_on_scale(12.0, 200.0) and not cap_on_scale(0.001, 200.0)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    hbars(ax, ["a-r1", "b-r1"], [0.0005, 0.001], ["0.0005 of 200 GPU-h", "0.001 of 200 GPU-h"])
    left, right = ax.get_xlim()
    assert left == 0 and right == pytest.approx(0.0016)  # the largest bar fills 5/8 of the axis, whatever the cap
    assert [t.get_text() for t in ax.texts] == ["0.0005 of 200 GPU-h", "0.001 of 200 GPU-h"]
    plt.close(fig)


def test_malformed_dump_is_an_error_naming_the_line(tmp_path):
    sd = _search(tmp_path)
    dump = tmp_path / "bad.txt"
    dump.write_bytes(sample("simple.txt") + b"13|13|x|COMPLETED|0:0\n")
    res = parcel_hpc(["reconcile", str(sd.path), "--sacct-file", str(dump)])
    assert res.returncode == 2 and "bad.txt:3:" in res.stderr and res.stderr.count("\n") == 1  # names the line


def test_unreachable_sacct_is_an_error_not_a_partial_report(tmp_path):
    sd = _search(tmp_path)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text("#!/bin/sh\necho 'sacct: error: slurmdbd: Connection refused' >&2\nexit 1\n")
    (fake / "sacct").chmod(0o755)
    import os

    res = parcel_hpc(["reconcile", str(sd.path)], env={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert res.returncode == 2 and "sacct" in res.stderr and res.stdout == ""


def test_step_rows_of_a_failed_node_have_no_exit_code_but_allocations_must():
    # Recorded on the dev cluster: a node set DOWN leaves the job's steps with an empty ExitCode.
    runs = sacct_runs(parse_sacct(sample("node_fail_steps_without_exit_code.txt")))
    assert [(a.job_id, a.state.text, a.elapsed_s) for a in runs] == [("46", "NODE_FAIL", 5)]
    broken = sample("node_fail_steps_without_exit_code.txt").replace(b"|NODE_FAIL|0:0|", b"|NODE_FAIL||", 1)
    from parcel_hpc.errors import AccountingError

    with pytest.raises(AccountingError, match=":1: ExitCode"):
        parse_sacct(broken, source="dump")
