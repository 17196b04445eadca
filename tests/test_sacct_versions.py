"""sacct's text from each Slurm version the project runs on (22.05 on Debian 12, 24.11 on Debian 13,
26.05 in sid), recorded by tests/slurm/record_sacct.py (scripts/newer-slurm.sh VERSION --record): the
parser reads them all, and reconcile stays exact on what each version does with a preempted job."""

import calendar
import subprocess
import time
from pathlib import Path

import pytest

from parcel_hpc.accounting.reconcile import FlagKind, Waste, reconcile
from parcel_hpc.budget import BudgetCaps, Rates
from parcel_hpc.errors import AccountingError
from parcel_hpc.ledger import Event, TrialSpec, fold
from parcel_hpc.scheduler.runs import JobRun
from parcel_hpc.scheduler.slurm.runs import sacct_runs
from parcel_hpc.scheduler.slurm.sacct import SACCT_FORMAT, build_sacct_argv
from parcel_hpc.scheduler.slurm.sacct_parse import parse_sacct
from parcel_hpc.scheduler.slurm.version import SlurmVersion
from parcel_hpc.scheduler.states import JobState
from parcel_hpc.testing.fakeslurm import FakeSlurm

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "sacct").glob("preempt_requeue_*.txt"))
CAPS = BudgetCaps(max_trials=10, gpu_hours_cap=1.0, cost_cap=10.0, rates=Rates(per_gpu_hour=2.0, per_cpu_hour=0.5))


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in path.stem.removeprefix("preempt_requeue_").split("."))


def _runs(path: Path, name: str) -> list[JobRun]:
    table = parse_sacct(path.read_bytes(), source=path.name, allocations_only=True)
    named = {j for j, n in zip(table.column("job_id").to_pylist(), table.column("job_name").to_pylist()) if n == name}
    return [r for r in sacct_runs(table) if r.job_id in named]


def test_fixtures_from_every_version_are_here():
    assert {v[:2] for v in map(_version, FIXTURES)} >= {(22, 5), (24, 11), (26, 5)}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_version_s_preemption_parses_to_runs(path):
    victim = _runs(path, "rec-victim")
    assert [r.attempt for r in victim] == list(range(len(victim))) and len(victim) >= 2
    assert victim[0].state is JobState.PREEMPTED and victim[-1].state is JobState.COMPLETED
    assert all(r.gpus == 1 and r.start is not None and r.end is not None for r in victim)
    (killed,) = _runs(path, "rec-exit137")
    # `exit 137`: stored modulo 128 before 25.11, whole since.
    assert (killed.state, killed.exit_status) == (JobState.FAILED, 137 if SlurmVersion(*_version(path)).stores_whole_exit_status else 9)


def _ev(kind, t, **kw):
    defaults = {"executor": "slurm", "launch_id": "l1"} if kind == "submitted" else {}
    return Event.from_json({"kind": kind, "t": t, "writer": "w", "seq": t, **defaults, **kw})


def _spec():
    return TrialSpec("t0001", 1, {"lr": 0.1}, 1, "sha256:" + "1".rjust(64, "0"), "sha256:" + "c" * 64, "sha256:" + "i" * 64, {"gpus": 1, "cpus": 1})


def _ledger(runs: list[JobRun], worked: list[str]) -> list[Event]:
    """What the workers recorded: one attempt per run in ``worked`` (its ending), in order."""
    events = [_ev("submitted", runs[0].submit, job_id=runs[0].job_id)]
    for n, (run, how) in enumerate(zip(runs, worked), 1):
        events.append(_ev("started", run.start + 1, attempt=n, job_id=run.job_id))
        ending = {"how": "completed", "metric": 0.3, "step": 82} if how == "completed" else {"how": "interrupted", "cause": "preempted", "step": 20}
        events.append(_ev("ended", run.end - 1 if how != "completed" else run.end, attempt=n, **ending))
    return events


def _first_run_s_work_completed(path: Path) -> bool:
    """The victim's first run: its batch step COMPLETED (the work ended inside the preemption's grace
    time, and Slurm filed the run PREEMPTED anyway), or was killed."""
    table = parse_sacct(path.read_bytes(), source=path.name)
    steps = [
        (s, t)
        for s, t, n in zip(table.column("step").to_pylist(), table.column("state_text").to_pylist(), table.column("job_id").to_pylist())
        if s == "batch" and n == "1"
    ]
    return steps[0][1] == "COMPLETED"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_preempted_run_that_completed_is_the_trial_s_and_an_extra_run_overhead_flagged_once(path):
    """24.11 and 26.05 filed the run that did the work PREEMPTED (its batch step COMPLETED within the
    grace time) and ran the job once more, a run that found the work done and did nothing; 22.05
    killed the first run at the grace time's end and the second did the work."""
    runs = _runs(path, "rec-victim")
    if not _first_run_s_work_completed(path):
        rec = reconcile("s1", "m", "test", [fold(_spec(), _ledger(runs, ["interrupted", "completed"]))], runs, [], CAPS, now=runs[-1].end + 10)
        assert rec.flags == () and [a.waste for a in rec.attempts] == [Waste.PREEMPTION, Waste.USEFUL]
        assert rec.waste_hours["preemption"] == pytest.approx(runs[0].gpu_hours)
        return
    assert [r.state for r in runs] == [JobState.PREEMPTED, JobState.COMPLETED]
    rec = reconcile("s1", "m", "test", [fold(_spec(), _ledger(runs, ["completed"]))], runs, [], CAPS, now=runs[-1].end + 10)
    assert [(f.kind, f.job_id) for f in rec.flags] == [(FlagKind.RUN_AFTER_FINISH, runs[0].job_id)]
    assert [(a.run, a.ledger_attempt, a.waste) for a in rec.attempts] == [(0, 1, Waste.USEFUL), (1, None, Waste.RUN_AFTER_FINISH)]
    assert rec.waste_hours["preemption"] == 0.0 and rec.waste_hours["run_after_finish"] == pytest.approx(runs[1].gpu_hours)
    assert rec.pending == () and rec.complete  # the extra run is not a worker yet to report: nothing to wait for


def test_the_recordings_show_both_endings_of_a_preemption():
    assert {_first_run_s_work_completed(p) for p in FIXTURES} == {True, False}


def test_the_issue_s_24_11_pattern_preempted_resumed_filed_preempted_and_run_again():
    """Run 0 preempted (checkpointed), run 1 resumed and completed but filed PREEMPTED, run 2 did
    nothing: the preemption's waste is run 0 alone, run 2 one flag."""
    (path,) = [p for p in FIXTURES if _version(p)[:2] == (24, 11)]
    done, extra = _runs(path, "rec-victim")
    shift = done.end - done.start + 30
    first = JobRun(**{**done.__dict__, "attempt": 0, "start": done.start - shift, "end": done.end - shift, "submit": done.submit - shift})
    runs = [first, JobRun(**{**done.__dict__, "attempt": 1}), JobRun(**{**extra.__dict__, "attempt": 2})]
    rec = reconcile("s1", "m", "test", [fold(_spec(), _ledger(runs, ["interrupted", "completed"]))], runs, [], CAPS, now=runs[-1].end + 10)
    assert [f.kind for f in rec.flags] == [FlagKind.RUN_AFTER_FINISH]
    assert [a.waste for a in rec.attempts] == [Waste.PREEMPTION, Waste.USEFUL, Waste.RUN_AFTER_FINISH]
    assert rec.waste_hours["preemption"] == pytest.approx(first.gpu_hours)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_26_05_s_per_run_columns_are_read_where_sacct_printed_them(path):
    table = parse_sacct(path.read_bytes(), source=path.name, allocations_only=True)
    version = SlurmVersion(*_version(path))
    sluid, restarts = table.column("sluid").to_pylist(), table.column("restarts").to_pylist()
    if not version.per_run_fields:
        assert set(sluid) == {None} and set(restarts) == {None}
        return
    victim = [i for i, name in enumerate(table.column("job_name").to_pylist()) if name == "rec-victim"]
    assert [restarts[i] for i in victim] == list(range(len(victim)))  # the run's own count, as --duplicates orders them
    assert len({sluid[i] for i in victim}) == len(victim) and all(sluid[i] for i in victim)  # one id per run


def test_the_version_decides_what_sacct_is_asked_and_how_its_exit_statuses_read():
    old, new = SlurmVersion.parse("slurm 24.11.5"), SlurmVersion.parse("slurm-wlm 26.05.5")
    assert (str(old), old < new, old.stores_whole_exit_status, new.stores_whole_exit_status) == ("24.11.5", True, False, True)
    assert SlurmVersion.parse("slurm 25.11.0").stores_whole_exit_status and not SlurmVersion.parse("25.05.3").per_run_fields
    assert (
        build_sacct_argv([7], version=old)
        == build_sacct_argv([7])
        == ["sacct", "--parsable2", "--noheader", "--duplicates", f"--format={SACCT_FORMAT}", "--jobs=7"]
    )
    assert build_sacct_argv([7], version=new)[4] == f"--format={SACCT_FORMAT},SLUID,Restarts"
    with pytest.raises(AccountingError, match="cannot read a Slurm version from 'slurm'"):
        SlurmVersion.parse("slurm")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_the_fake_slurm_in_each_version_prints_that_version_s_rows(path, tmp_path):
    """The fake cluster told a version answers as the recording of that version's real sacct does:
    its version string, its columns (26.05's SLUID and Restarts when asked), its exit statuses."""
    version = SlurmVersion(*_version(path))
    fake = FakeSlurm.create(tmp_path / "fake", version=str(version), requeue_delay_s=0.5)
    env = fake.env()

    def sh(*argv: str) -> str:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert SlurmVersion.parse(sh("sacct", "--version")) == version
    killed = sh("sbatch", "--parsable", "-J", "rec-exit137", "-o", "/dev/null", "--wrap", "exit 137").strip()
    requeued = sh("sbatch", "--parsable", "-J", "rec-victim", "-o", "/dev/null", "--wrap", f"touch {tmp_path}/ran.${{SLURM_RESTART_COUNT:-0}}; sleep 1").strip()
    deadline = time.monotonic() + 60
    while not (tmp_path / "ran.0").exists():
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.1)
    sh("scontrol", "requeue", requeued)
    fake.wait_idle(timeout=60)
    text = sh(*build_sacct_argv([killed, requeued], version=version)).encode()
    recorded = [line.count("|") for line in path.read_text().splitlines() if "." not in line.split("|")[0]]
    printed = [line.count("|") for line in text.decode().splitlines() if "." not in line.split("|")[0]]
    assert set(printed) == set(recorded)  # every job row as many columns as the real one printed
    runs = sacct_runs(parse_sacct(text, source="fake", allocations_only=True))
    by_job = {r.job_id: [x for x in runs if x.job_id == r.job_id] for r in runs}
    (exit137,) = by_job[killed]
    assert (exit137.state, exit137.exit_status) == (JobState.FAILED, 137 if version.stores_whole_exit_status else 9)
    assert [r.state for r in by_job[requeued]] == [JobState.REQUEUED, JobState.COMPLETED]
    table = parse_sacct(text, source="fake", allocations_only=True)
    if version.per_run_fields:
        mine = [
            (s, n)
            for j, s, n in zip(table.column("job_id").to_pylist(), table.column("sluid").to_pylist(), table.column("restarts").to_pylist())
            if j == requeued
        ]
        assert [n for _, n in mine] == [0, 1] and len({s for s, _ in mine}) == 2  # a run's own id; the requeues before it
    else:
        assert table.column("sluid").null_count == len(table)


def test_a_gang_s_srun_steps_are_read_per_run_and_set_beside_the_runs_they_ran_in():
    """A job of 2 nodes x 2 tasks on 22.05, requeued once (``scontrol requeue``): sacct's steps
    (``build_steps_argv``'s fields) as recorded; its step 0 ran in each run."""
    from parcel_hpc.accounting.ranks import step_lines
    from parcel_hpc.accounting.reconcile import AttemptLine
    from parcel_hpc.scheduler.slurm.steps import STEP_FIELDS, build_steps_argv, cpu_seconds, parse_steps

    assert f"--format={','.join(STEP_FIELDS)}" in build_steps_argv(["64"]) and "--noconvert" in build_steps_argv(["64"])
    text = (Path(__file__).parent / "fixtures" / "sacct" / "steps_requeued_gang_22.05.8.txt").read_text()
    first, second = parse_steps(text)  # the batch steps and the allocation rows are no rank's
    assert (first.job_id, first.step, first.nodes, first.tasks, first.node_list) == ("64", "0", 2, 4, "n[1-2]")
    assert first.cpu_s == pytest.approx(7.651) and first.memory_bytes == 55087104
    assert (first.busiest_task, first.busiest_node, first.busiest_cpu_s) == (2, "n2", 1.0)
    assert (second.cpu_s, second.busiest_task, second.elapsed_s) == (pytest.approx(13.313), 3, 8)

    def line(run: int, start: int, end: int, elapsed: int) -> AttemptLine:
        return AttemptLine(
            "t0000", "64", run, "COMPLETED", "n[1-2]", start, start, end, elapsed, 0, 4, 0.0, 4 * elapsed / 3600, 0.0, 0, run + 1, "", Waste.USEFUL
        )

    t0 = calendar.timegm(time.strptime("2026-12-06T12:54:01", "%Y-%m-%dT%H:%M:%S"))  # sacct's UTC (run_sacct sets TZ)
    steps = step_lines([line(0, t0, t0 + 4, 4), line(1, t0 + 19, t0 + 27, 8)], iter([first, second]))  # any iterable: read once
    assert [(s.trials, s.run, s.ranks, s.busiest_rank) for s in steps] == [("t0000", 0, 4, 2), ("t0000", 1, 4, 3)]  # each run its own step 0
    assert steps[0].cpu_hours_used == pytest.approx(7.651 / 3600) and steps[0].cpu_use == pytest.approx(7.651 / 16)  # of 4 CPUs x 4 s
    assert step_lines([line(0, t0 + 100, t0 + 104, 4)], [first, second]) == ()  # another run's steps: not this one's

    assert cpu_seconds("1-02:03:04") == 93784 and cpu_seconds("03:04.500") == 184.5 and cpu_seconds("00:00:08") == 8
    with pytest.raises(AccountingError, match="steps.txt:1: 3 fields"):
        parse_steps("64.0|x|y\n", source="steps.txt")
    with pytest.raises(AccountingError, match="not a CPU time"):
        parse_steps(text.replace("00:07.651", "seven seconds"))
