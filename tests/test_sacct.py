"""sacct accounting: states, argv, the real subprocess edge, the columnar parser, job runs.

Samples come from parcel_hpc/testing/samples (reconstructed from real 22.05 outputs; the
stderr recording is real). run_sacct is exercised with real subprocesses: fake `sacct`
scripts on a private PATH, the only fake being the binary at the edge.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parcel_hpc.errors import AccountingError, UsageError
from parcel_hpc.ledger import Cause
from parcel_hpc.scheduler.run_table import RUN_COLUMNS
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slurm.runs import run_table, sacct_runs, totals_by_job
from parcel_hpc.scheduler.slurm.sacct import SACCT_FIELDS, SACCT_FORMAT, build_sacct_argv, installed_version, run_sacct
from parcel_hpc.scheduler.slurm.sacct_parse import SacctTable, parse_sacct
from parcel_hpc.scheduler.slurm.version import SlurmVersion
from parcel_hpc.scheduler.states import JobState
from parcel_hpc.testing.samples import read_sample, sample_names, sample_path

GOOD_SAMPLES = [n for n in sample_names() if not n.startswith("malformed")]
T0 = "2026-11-29T06:44:30"


def row(
    job_id="1", raw=None, state="COMPLETED", exit_code="0:0", submit=T0, start=T0, end=T0, elapsed="0", tres="billing=1,cpu=1,mem=1G,node=1", name="j"
) -> str:
    raw = job_id if raw is None else raw
    return "|".join([job_id, raw, name, state, exit_code, submit, start, end, elapsed, tres, "n1", "low", "parcel", "normal", "root", "None"])


def parse_lines(*lines: str, source: str = "inline") -> SacctTable:
    return parse_sacct(("\n".join(lines) + "\n").encode(), source=source)


def by_job(name: str) -> dict[str, list[JobRun]]:
    out: dict[str, list[JobRun]] = {}
    for a in sacct_runs(parse_sacct(read_sample(name), source=name)):
        out.setdefault(a.job_id, []).append(a)
    return out


# ---- JobState -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(JobState), ids=lambda s: s.text)
def test_every_state_word_maps_once_and_round_trips_its_code(state):
    assert JobState.parse(state.text) is state
    assert JobState.from_code(state.code) is state
    assert state.is_terminal() is not state.is_active()


@pytest.mark.parametrize("text", ["CANCELLED by 0", "CANCELLED by 1234"])
def test_cancelled_by_uid_is_cancelled(text):
    assert JobState.parse(text) is JobState.CANCELLED


@pytest.mark.parametrize("text", ["", "completed", "CANCELLED+", "CANCELLED by root", "RUNNING ", "DONE"])
def test_unknown_state_text_raises(text):
    with pytest.raises(AccountingError, match="unknown SLURM job state"):
        JobState.parse(text)


def test_state_predicates():
    S = JobState
    assert {s for s in S if s.is_active()} >= {S.PENDING, S.RUNNING, S.SUSPENDED, S.REQUEUE_HOLD}
    for s in (
        S.COMPLETED,
        S.FAILED,
        S.CANCELLED,
        S.TIMEOUT,
        S.NODE_FAIL,
        S.OUT_OF_MEMORY,
        S.BOOT_FAIL,
        S.DEADLINE,
        S.PREEMPTED,
        S.REQUEUED,
        S.RESIZING,
        S.REVOKED,
    ):
        assert s.is_terminal(), s
    assert {s for s in S if s.is_success()} == {S.COMPLETED}
    assert S.CANCELLED.is_cancelled() and S.REVOKED.is_cancelled() and not S.FAILED.is_cancelled()


def test_one_table_says_what_each_ending_means_for_the_attempt():
    S = JobState
    # The two former tables disagreed: BOOT_FAIL is the node's fault like NODE_FAIL, and DEADLINE is
    # the allocation's limit like TIMEOUT (both retried from the checkpoint, never the design's fault).
    assert S.BOOT_FAIL.cause() is S.NODE_FAIL.cause() is Cause.NODE_FAIL
    assert S.DEADLINE.cause() is S.TIMEOUT.cause() is Cause.TIMEOUT
    assert all(S[name].cause().is_infrastructure() for name in ("BOOT_FAIL", "NODE_FAIL", "DEADLINE", "TIMEOUT", "PREEMPTED", "CANCELLED", "REVOKED"))
    assert S.OUT_OF_MEMORY.cause().is_training_failure()
    assert S.FAILED.cause() is None and S.REQUEUED.cause() is None and S.COMPLETED.cause() is None
    assert all(s.cause() is None for s in S if s.is_active())


# ---- argv ---------------------------------------------------------------------------------


def test_argv_for_job_ids_keeps_order_and_dedups():
    argv = build_sacct_argv([12, "29_3", "12", "45"])
    assert argv == ["sacct", "--parsable2", "--noheader", "--duplicates", f"--format={SACCT_FORMAT}", "--jobs=12,29_3,45"]
    assert "Restarts" not in SACCT_FIELDS
    assert {
        "JobID",
        "JobIDRaw",
        "JobName",
        "State",
        "ExitCode",
        "Submit",
        "Start",
        "End",
        "ElapsedRaw",
        "AllocTRES",
        "NodeList",
        "Partition",
        "Account",
        "QOS",
    } <= set(SACCT_FIELDS)


def test_argv_lists_by_name_and_account_since_a_time_in_utc():
    since = dt.datetime(2026, 11, 29, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    argv = build_sacct_argv([], since=since, name="parcel-search", account="parcel")
    assert argv[5:] == ["--starttime=2026-11-29T07:00:00", "--endtime=now", "--name=parcel-search", "--accounts=parcel"]
    assert build_sacct_argv([], since=0, account="a")[5] == "--starttime=1970-01-01T00:00:00"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(job_ids=[]), "needs job ids"),
        (dict(job_ids=[], name="x"), "needs since"),
        (dict(job_ids=["12.batch"]), "bad SLURM job id"),
        (dict(job_ids=["-1"]), "bad SLURM job id"),
        (dict(job_ids=[True]), "bad SLURM job id"),
        (dict(job_ids="12"), "collection"),
        (dict(job_ids=[], name="a,b", since=0), "bad name"),
        (dict(job_ids=[], account="", since=0), "bad account"),
        (dict(job_ids=[], name="x", since=dt.datetime(2026, 1, 1)), "no time zone"),
    ],
)
def test_argv_rejects_bad_input(kwargs, match):
    job_ids = kwargs.pop("job_ids")
    with pytest.raises(UsageError, match=match):
        build_sacct_argv(job_ids, **kwargs)


# ---- run_sacct against real subprocesses ----------------------------------------------------


def fake_sacct(tmp_path: Path, body: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "sacct"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def test_run_sacct_returns_stdout_with_utc_times_and_the_argv(tmp_path):
    sample = sample_path("simple.txt")
    env = fake_sacct(
        tmp_path,
        f'''
[ "$TZ" = UTC ] && [ "$SLURM_TIME_FORMAT" = standard ] || exit 3
printf '%s\\n' "$@" > "{tmp_path}/argv"
cat "{sample}"
''',
    )
    env["TZ"] = "Europe/Zurich"  # the caller's zone must not leak into sacct's times
    argv = build_sacct_argv([1])
    assert run_sacct(argv, env=env) == sample.read_bytes()
    assert (tmp_path / "argv").read_text().splitlines() == argv[1:]


def test_run_sacct_failing_sacct_raises_naming_the_problem(tmp_path):
    recorded = sample_path("sacct_dbd_unreachable.stderr.txt")
    env = fake_sacct(tmp_path, f'cat "{recorded}" >&2\nexit 1\n')
    with pytest.raises(AccountingError) as info:
        run_sacct(build_sacct_argv([1]), env=env)
    message = str(info.value)
    assert "sacct exited 1" in message and "Problem talking to the database: Connection refused" in message
    assert "\n" not in message and "slurmdbd" in message


def test_run_sacct_error_on_stderr_with_exit_0_is_not_a_partial_answer(tmp_path):
    env = fake_sacct(tmp_path, 'echo "1|1|x"\necho "sacct: error: Problem talking to the database" >&2\nexit 0\n')
    with pytest.raises(AccountingError, match="exited 0"):
        run_sacct(["sacct"], env=env)


def test_run_sacct_missing_binary(tmp_path):
    with pytest.raises(AccountingError, match="not found on PATH"):
        run_sacct(["sacct", "--version"], env={"PATH": str(tmp_path)})


def test_run_sacct_timeout(tmp_path):
    env = fake_sacct(tmp_path, "exec sleep 30\n")
    with pytest.raises(AccountingError, match="did not answer within 0.5s"):
        run_sacct(["sacct"], env=env, timeout=0.5)


# ---- parsing the samples ----------------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD_SAMPLES)
def test_every_sample_parses_one_row_per_line(name):
    data = read_sample(name)
    table = parse_sacct(data, source=name)
    assert len(table) == data.count(b"\n")
    assert table.column("line").to_pylist() == list(range(1, len(table) + 1))
    assert table.table.column("state").null_count == 0


@pytest.mark.parametrize(
    "name, job_id, states, exit_codes",
    [
        ("simple.txt", "1", ["COMPLETED"], [(0, 0)]),
        ("requeue_duplicates.txt", "12", ["REQUEUED", "COMPLETED"], [(0, 0), (0, 0)]),
        ("submitit_timeouts.txt", "42", ["REQUEUED"] * 3 + ["FAILED"], [(0, 0)] * 3 + [(1, 0)]),
        ("preempted.txt", "8", ["PREEMPTED", "PENDING"], [(0, 0), (0, 0)]),
        ("node_fail.txt", "24", ["NODE_FAIL", "RUNNING"], [(0, 0), (0, 0)]),
        ("node_fail.txt", "48", ["NODE_FAIL", "FAILED"], [(0, 0), (1, 0)]),
        ("timeout.txt", "7", ["TIMEOUT"], [(0, 0)]),
        ("exit_codes.txt", "32", ["FAILED"], [(2, 0)]),
        ("exit_codes.txt", "34", ["FAILED"], [(127, 0)]),
        ("exit_codes.txt", "37", ["FAILED"], [(0, 9)]),
        ("exit_codes.txt", "38", ["FAILED"], [(0, 10)]),
        ("exit_codes.txt", "39", ["CANCELLED"], [(0, 0)]),
        ("out_of_memory_cgroup.txt", "1", ["OUT_OF_MEMORY"], [(0, 125)]),
    ],
)
def test_attempts_per_job_in_order(name, job_id, states, exit_codes):
    runs = by_job(name)[job_id]
    assert [a.state.name for a in runs] == states
    assert [(a.exit_status, a.exit_signal) for a in runs] == exit_codes
    assert [a.attempt for a in runs] == list(range(len(states)))


def test_real_recording_from_the_dev_cluster():
    jobs = by_job("recorded_dev_cluster.txt")
    # sacct -D printed 59's re-run at the end of the text (line 19), after other jobs.
    assert [(a.state, a.line) for a in jobs["59"]] == [(JobState.REQUEUED, 9), (JobState.COMPLETED, 19)]
    assert jobs["59"][1].submit == jobs["59"][0].end  # Submit is reset at the requeue
    assert (jobs["55_3"][0].raw_job_id, jobs["55_0"][0].raw_job_id) == (55, 60)
    assert [(a.state, a.exit_status, a.exit_signal) for j in ("56", "57", "58") for a in jobs[j]] == [
        (JobState.FAILED, 3, 0),
        (JobState.FAILED, 0, 9),
        (JobState.CANCELLED, 0, 0),
    ]
    assert jobs["54"][0].gpu_hours == pytest.approx(1 * 2 / 3600)


def test_cancelled_by_uid_keeps_its_text_and_step_rows_are_not_runs():
    table = parse_sacct(read_sample("exit_codes.txt"), source="exit_codes.txt")
    rows = table.table.to_pylist()
    assert {r["state_text"] for r in rows if r["job_id"] == "6"} == {"FAILED", "CANCELLED by 0"}
    assert [r["step"] for r in rows if r["job_id"] == "39"] == [None, "batch"]
    assert len(sacct_runs(table)) == 11


def test_array_last_task_carries_the_master_id_but_stays_its_own_job():
    jobs = by_job("array_master_on_last_task.txt")
    assert sorted(jobs, key=lambda j: int(j.split("_")[1])) == [f"2_{k}" for k in range(10)]
    last = jobs["2_9"][0]
    assert (last.raw_job_id, last.base_job_id, last.array_task) == (2, 2, 9)
    assert jobs["2_0"][0].raw_job_id == 3
    assert all(len(runs) == 1 for runs in jobs.values())
    submitit = by_job("submitit_arrays.txt")
    assert submitit["29_9"][0].raw_job_id == 29 and submitit["45_2"][0].raw_job_id == 45


def test_steps_are_rows_of_their_job():
    table = parse_sacct(read_sample("steps_multinode.txt"), source="s").table
    assert table.column("step").to_pylist() == [None, "batch", "extern", "0"]
    assert table.column("is_allocation").to_pylist() == [True, False, False, False]
    assert set(table.column("job_id").to_pylist()) == {"16"}
    assert table.column("raw_job_id").to_pylist() == [16] * 4
    assert table.column("gpus").to_pylist() == [3, 1, 3, 3]
    (job,) = sacct_runs(parse_sacct(read_sample("steps_multinode.txt"), source="s"))
    assert (job.node_list, job.gpus, job.cpus) == ("n[1-3]", 3, 3)


def test_pending_rows_have_no_times_no_resources_and_no_queue_wait():
    pending = by_job("preempted.txt")["8"][1]
    assert (pending.start, pending.end, pending.gpus, pending.elapsed_s) == (None, None, 0, 0)
    assert pending.queue_wait_s is None and pending.node_list == "None assigned"
    rng = by_job("array_pending_range.txt")["50_[2-9%2]"][0]
    assert (rng.base_job_id, rng.array_task, rng.state) == (50, None, JobState.PENDING)


def test_times_are_epoch_seconds_and_hours_follow_alloc_tres():
    runs = by_job("requeue_duplicates.txt")["12"]
    first = runs[0]
    assert first.start == int(dt.datetime(2026, 11, 29, 6, 45, 36, tzinfo=dt.UTC).timestamp())
    assert (first.end - first.start, first.elapsed_s, first.gpus) == (4, 4, 2)
    assert first.gpu_hours == pytest.approx(2 * 4 / 3600)
    assert runs[1].queue_wait_s == 69  # resubmitted at the requeue, started 69 s later


@pytest.mark.parametrize(
    "tres, gpus, cpus, billing",
    [
        ("billing=11,cpu=1,gres/gpu=1,mem=100M,node=1", 1, 1, 11),
        ("cpu=4,gres/gpu:a100=2,gres/gpu=2,mem=1G,node=1", 2, 4, 0),
        ("billing=3,cpu=3,mem=300M,node=3", 0, 3, 3),
        ("", 0, 0, 0),
        ("gres/gpumem=40G,cpu=2,gres/gpu=8", 8, 2, 0),
    ],
)
def test_alloc_tres_counts(tres, gpus, cpus, billing):
    t = parse_lines(row(tres=tres)).table
    assert (t.column("gpus")[0].as_py(), t.column("cpus")[0].as_py(), t.column("billing")[0].as_py()) == (gpus, cpus, billing)


def test_header_trailing_blank_lines_crlf_and_empty_input():
    header = "|".join(SACCT_FIELDS)
    t = parse_sacct(f"{header}\r\n{row('5')}\r\n{row('6')}\r\n\r\n\n".encode(), source="h")
    assert t.column("job_id").to_pylist() == ["5", "6"]
    assert t.column("line").to_pylist() == [2, 3]
    assert len(parse_sacct(b"", source="e")) == 0 and len(parse_sacct(b"\n", source="e")) == 0
    assert run_table(parse_sacct(b"", source="e")).num_rows == 0
    assert totals_by_job(run_table(parse_sacct(b"", source="e"))).num_rows == 0
    with pytest.raises(AccountingError, match=r"^h:1: header names the fields"):
        parse_sacct(b"JobID|State\n1|COMPLETED\n", source="h")


def test_time_zone_of_an_exported_dump():
    utc = parse_lines(row()).column("start")[0].as_py()
    zurich = parse_sacct((row() + "\n").encode(), source="z", tz="Europe/Zurich").column("start")[0].as_py()
    assert utc - zurich == 3600
    with pytest.raises(UsageError, match="unknown time zone"):
        parse_sacct((row() + "\n").encode(), source="z", tz="Mars/Olympus")


# ---- malformed input: an error naming source and line, never a crash or a skip ------------------


@pytest.mark.parametrize(
    "name, problem",
    [
        ("malformed_field_count.txt", "expected 16 '|'-separated fields, found 15"),
        ("malformed_elapsed.txt", "ElapsedRaw '2s'"),
        ("malformed_date.txt", "Start '29/11/2026 06:44'"),
    ],
)
def test_malformed_samples_name_the_line(name, problem):
    with pytest.raises(AccountingError) as info:
        parse_sacct(read_sample(name), source=name)
    assert str(info.value).startswith(f"{name}:3: ")
    assert problem in str(info.value)


@pytest.mark.parametrize(
    "bad, problem",
    [
        (row("9", state="FINISHED"), "unknown SLURM job state 'FINISHED'"),
        (row("9", exit_code="0"), "ExitCode '0'"),
        (row("9", elapsed="-3"), "ElapsedRaw '-3'"),
        (row("9", elapsed="Unknown"), "ElapsedRaw 'Unknown'"),
        (row("9", end="2026-02-30T00:00:00"), "End '2026-02-30T00:00:00'"),
        (row("x9"), "JobID 'x9'"),
        (row("9_a"), "JobID '9_a'"),
        (row("9."), "JobID '9.'"),
        (row("9", raw="b"), "JobIDRaw 'b'"),
        (row("1234567890123456789"), "longer than 18 digits"),
        ("", "found 1"),
        (row("9") + "|extra", "found 17 (a '|' inside a job name?)"),
    ],
)
def test_malformed_lines_raise_with_the_line_number(bad, problem):
    data = ("\n".join([row("1"), row("1.batch"), bad, row("2")]) + "\n").encode()
    with pytest.raises(AccountingError) as info:
        parse_sacct(data, source="dump.txt")
    assert str(info.value).startswith("dump.txt:3: ") and problem in str(info.value)
    assert "\n" not in str(info.value)


def test_non_utf8_line():
    data = (row("1") + "\n").encode() + row("2", name="x").encode().replace(b"|x|", b"|\xff|") + b"\n"
    with pytest.raises(AccountingError, match=r"^s:2: line is not UTF-8"):
        parse_sacct(data, source="s")


# ---- the vectorized job id split agrees with a plain reference ------------------------------

_REF = re.compile(r"^(?P<job>(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+\d+)?)(?:\.(?P<step>.+))?$")
ids = st.builds(
    lambda base, task, het, step: f"{base}{task}{het}{step}",
    st.integers(0, 2**32).map(str),
    st.one_of(st.just(""), st.integers(0, 10**6).map(lambda t: f"_{t}"), st.sampled_from(["_[4-9]", "_[0-3,7%2]", "_[]"])),
    st.one_of(st.just(""), st.integers(0, 3).map(lambda h: f"+{h}")),
    st.one_of(st.just(""), st.sampled_from([".batch", ".extern", ".0", ".12", ".interactive"])),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(ids, min_size=1, max_size=20))
def test_job_id_columns_match_a_reference_parse(job_ids):
    table = parse_lines(*[row(j, raw="7") for j in job_ids]).table
    for j, got in zip(job_ids, table.select(["job_id", "base_job_id", "array_task", "step"]).to_pylist()):
        m = _REF.match(j)
        task = m["task"]
        assert got == {"job_id": m["job"], "base_job_id": int(m["base"]), "array_task": int(task) if task and task.isdigit() else None, "step": m["step"]}


# ---- job runs ---------------------------------------------------------------------------------


def test_job_run_is_validated_at_birth():
    good = by_job("simple.txt")["1"][0]
    for change in (
        dict(job_id="1.batch"),
        dict(gpus=-1),
        dict(attempt=True),
        dict(state="COMPLETED"),
        dict(start=good.submit - 1),
        dict(end=good.start - 1),
        dict(line=0),
    ):
        with pytest.raises((ValueError, TypeError)):
            dataclasses.replace(good, **change)


def test_impossible_times_raise_naming_the_line():
    data = parse_lines(row("1"), row("2", start="2026-11-29T06:44:40", end="2026-11-29T06:44:35"), source="d")
    with pytest.raises(AccountingError, match=r"^d:2: End .* is before Start"):
        run_table(data)


def test_run_order_follows_start_then_submit_not_the_line_order():
    late = row("3", state="COMPLETED", submit="2026-11-29T07:00:00", start="2026-11-29T07:00:05", end="2026-11-29T07:00:09", elapsed="4")
    early = row("3", state="PREEMPTED", submit="2026-11-29T06:00:00", start="2026-11-29T06:00:01", end="2026-11-29T06:00:02", elapsed="1")
    pending = row("3", state="PENDING", submit="2026-11-29T06:30:00", start="Unknown", end="Unknown", tres="")
    got = [(a.state.name, a.attempt, a.line) for a in sacct_runs(parse_lines(late, early, pending))]
    assert got == [("PREEMPTED", 0, 2), ("PENDING", 1, 3), ("COMPLETED", 2, 1)]


def test_columnar_totals_match_the_records():
    data = b"".join(read_sample(n) for n in ("requeue_duplicates.txt", "submitit_timeouts.txt", "node_fail.txt", "preempted.txt", "submitit_arrays.txt"))
    table = parse_sacct(data, source="all")
    at = run_table(table)
    assert tuple(at.column_names) == RUN_COLUMNS
    totals = {r["job_id"]: r for r in totals_by_job(at).to_pylist()}
    records: dict[str, list[JobRun]] = {}
    for a in sacct_runs(table):
        records.setdefault(a.job_id, []).append(a)
    assert set(totals) == set(records)
    for job_id, runs in records.items():
        t = totals[job_id]
        assert t["attempts"] == len(runs)
        assert t["gpu_hours"] == pytest.approx(sum(a.gpu_hours for a in runs))
        assert t["cpu_hours"] == pytest.approx(sum(a.cpu_hours for a in runs))
        assert t["elapsed_s"] == sum(a.elapsed_s for a in runs)
        assert t["queue_wait_s"] == sum(a.queue_wait_s or 0 for a in runs)
        assert JobState.from_code(t["final_state"]) is runs[-1].state
        assert t["last_end"] == runs[-1].end
        assert t["first_submit"] == min(a.submit for a in runs)
    assert totals["42"]["attempts"] == 4 and JobState.from_code(totals["42"]["final_state"]) is JobState.FAILED
    assert totals["24"]["last_end"] is None  # still running
    # The fast path straight from the SacctTable gives the same sums.
    direct = {r["job_id"]: r for r in totals_by_job(table).to_pylist()}
    assert direct.keys() == totals.keys()
    for job_id, t in totals.items():
        assert direct[job_id] == pytest.approx(t)
    with pytest.raises(TypeError):
        totals_by_job(table.table)


def test_sacct_table_rejects_foreign_tables():
    with pytest.raises(TypeError):
        SacctTable(pa.table({"x": [1]}), "s")
    with pytest.raises(UsageError):
        parse_sacct("text", source="s")  # type: ignore[arg-type]


# ---- large inputs: threads, and the vectorized error locator ----------------------------------


def big_dump(n_rows: int) -> list[str]:
    lines = read_sample("requeue_duplicates.txt").decode().splitlines()
    return [lines[i % len(lines)].replace("12", str(100 + i // len(lines)), 2) for i in range(n_rows)]


def test_threaded_derivation_equals_single_threaded(monkeypatch):
    from parcel_hpc.scheduler.slurm import sacct_parse as parse_module

    data = ("\n".join(big_dump(120_000)) + "\n").encode()
    threaded = parse_sacct(data, source="big").table
    monkeypatch.setattr(parse_module, "_THREADS", 1)
    single = parse_sacct(data, source="big").table
    assert threaded.equals(single)
    assert threaded.column("line")[-1].as_py() == 120_000
    assert len(sacct_runs(SacctTable(single, "big"))) == 80_000


def test_allocations_only_keeps_the_runs_and_still_checks_every_step_line(monkeypatch):
    from parcel_hpc.scheduler.slurm import sacct_parse as parse_module

    monkeypatch.setattr(parse_module, "_BLOCK_BYTES", 1 << 16)  # many blocks, several in flight
    lines = big_dump(30_000)
    data = ("\n".join(lines) + "\n").encode()
    every = parse_sacct(data, source="big")
    runs = parse_sacct(data, source="big", allocations_only=True)
    assert runs.table.equals(every.allocations()) and len(runs) < len(every)
    assert sacct_runs(runs) == sacct_runs(every)
    step = next(i for i, line in enumerate(lines) if i > 20_000 and ".batch|" in line)
    fields = lines[step].split("|")
    lines[step] = "|".join([*fields[:4], "x", *fields[5:]])  # a step's ExitCode
    with pytest.raises(AccountingError, match=rf"^big:{step + 1}: ExitCode"):
        parse_sacct(("\n".join(lines) + "\n").encode(), source="big", allocations_only=True)


def test_bad_line_in_the_second_thread_is_named(monkeypatch):
    from parcel_hpc.scheduler.slurm import sacct_parse as parse_module

    monkeypatch.setattr(parse_module, "_THREADS", 2)
    lines = big_dump(120_000)
    lines[110_000] = lines[110_000].replace("COMPLETED", "DONE")
    lines[115_000] = lines[115_000].replace("|0:0|", "|x|")
    with pytest.raises(AccountingError, match=r"^big:110001: unknown SLURM job state 'DONE'"):
        parse_sacct(("\n".join(lines) + "\n").encode(), source="big")


@pytest.mark.parametrize(
    "index, field, value",
    [
        (30_000, 8, "2s"),  # int conversion
        (30_000, 6, "2026-02-30T00:00:00"),  # a date pyarrow rejects but strptime rolls over
        (30_000, 7, "2026-02-03T24:00:00"),
        (30_000, 8, "99999999999999999999"),  # overflows int64
        (30_000, None, None),  # a missing field
    ],
)
def test_read_errors_are_located_without_a_python_scan(index, field, value):
    from parcel_hpc.scheduler.slurm._sacct_malformed import locate_read_error

    lines = big_dump(40_000)
    fields = lines[index].split("|")
    if field is None:
        del fields[3]
    else:
        fields[field] = value
    lines[index] = "|".join(fields)
    body = memoryview(("\n".join(lines)).encode())
    assert locate_read_error(body) == index
    with pytest.raises(AccountingError, match=rf"^big:{index + 1}: "):
        parse_sacct(bytes(body), source="big")
    assert locate_read_error(memoryview("\n".join(big_dump(1000)).encode())) is None


@pytest.mark.parametrize("first, second", [("fields", "elapsed"), ("elapsed", "fields")])
def test_the_earliest_of_two_bad_lines_is_named(first, second):
    lines = big_dump(1000)
    for index, kind in ((300, first), (600, second)):
        fields = lines[index].split("|")
        if kind == "fields":
            del fields[3]
        else:
            fields[8] = "x"
        lines[index] = "|".join(fields)
    with pytest.raises(AccountingError, match=r"^d:301: "):
        parse_sacct("\n".join(lines).encode(), source="d")


# ---- the real dev cluster ---------------------------------------------------------------------

needs_slurm = pytest.mark.skipif(
    not os.environ.get("SLURM_CONF"),
    reason="SLURM_CONF is not set: start scripts/dev-cluster-up.sh and source /tmp/parcel-slurm/env.sh",
)
CLUSTER_WAIT_S = 60  # jobs start ~1 s after sbatch; a requeued one re-runs within ~3 s of StartTime=now


def _sbatch(*args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", "--mem=100M", "-t", "2", "-o", "/dev/null", *args], capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.strip().split(";")[0]


def _runs_when(job_ids: list[str], done) -> list[JobRun]:
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while True:
        got = sacct_runs(parse_sacct(run_sacct(build_sacct_argv(job_ids)), source="sacct"))
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.mark.slurm
@needs_slurm
def test_real_sacct_requeue_array_and_listing_by_name(tmp_path):
    name = f"sacct-test-{os.getpid()}"
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
    array = _sbatch("-J", name, "--array=0-2", "--gres=gpu:1", "--wrap", "sleep 1")
    # Long on its first run (so a loaded machine still sees it RUNNING), short once requeued.
    requeued = _sbatch("-J", name, "--gres=gpu:2", "--wrap", 'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 90; else sleep 1; fi')
    try:
        running = _runs_when([requeued], lambda got: any(a.state is JobState.RUNNING for a in got))
        assert [a.state for a in running] == [JobState.RUNNING], running
        subprocess.run(["scontrol", "requeue", requeued], check=True, timeout=30)
        time.sleep(1)  # a requeued job is PENDING with a BeginTime; pull it forward
        subprocess.run(["scontrol", "update", f"jobid={requeued}", "StartTime=now"], check=True, timeout=30)
        got = _runs_when([array, requeued], lambda got: all(a.state.is_terminal() for a in got) and len(got) == 5)
    finally:
        subprocess.run(["scancel", array, requeued], check=False, timeout=30)
    by_id: dict[str, list[JobRun]] = {}
    for a in got:
        by_id.setdefault(a.job_id, []).append(a)
    assert [a.state for a in by_id[requeued]] == [JobState.REQUEUED, JobState.COMPLETED]
    assert by_id[requeued][1].queue_wait_s is not None and by_id[requeued][0].gpus == 2
    tasks = {f"{array}_{k}" for k in range(3)}
    assert tasks <= by_id.keys() and all(by_id[t][0].state is JobState.COMPLETED for t in tasks)
    assert by_id[f"{array}_2"][0].raw_job_id == int(array)  # the last task carries the master id

    def key(a: JobRun) -> tuple:
        return (a.job_id, a.attempt, a.state, a.start, a.end, a.gpus)

    # slurmdbd files a just-finished run a moment after the job-id query saw it: poll, bounded.
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while True:
        listed = parse_sacct(run_sacct(build_sacct_argv([], since=since, name=name, account="parcel")), source="list")
        if {key(a) for a in sacct_runs(listed)} >= {key(a) for a in got} or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {key(a) for a in sacct_runs(listed)} >= {key(a) for a in got}


@pytest.mark.slurm
@needs_slurm
def test_real_sacct_rejects_a_field_it_does_not_have():
    # A field this sacct lacks (22.05: Restarts, which 24.11 has; else one no version has) is an error, not an empty column.
    field = "Restarts" if installed_version() < SlurmVersion(23, 0) else "NoSuchField"
    with pytest.raises(AccountingError, match=f'Invalid field requested: "{field}"'):
        run_sacct(["sacct", "--parsable2", f"--format=JobID,{field}", "--jobs=1"])
