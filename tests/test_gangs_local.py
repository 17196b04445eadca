"""Trials of several ranks (issue 50) on the local executor: examples/parcel_loop's loop, data-parallel
(DistributedDataParallel over gloo), as one trial of 2 ranks, each a process submitit started. One
attempt and one claim for the gang, one checkpoint across its ranks (each rank's part, rank 0's
manifest); the scheduler's signal on any rank stops every rank at one step and the whole gang is
requeued and resumes bit-equal to the uninterrupted gang; a rank's exception is the trial's failure
with that rank's traceback; a rank that dies is an interruption; a rank that hangs is ended within
the bound (the launcher's signal_delay_s)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from browser import check_html_plots

from parcel_hpc.checkpoints import format as ckpt_format
from parcel_hpc.checkpoints.gang import Committed, GangCheckpoints, trainer_extra
from parcel_hpc.governance.admission import TrialIdentity
from parcel_hpc.ledger import AttemptEnd, Cause, SearchDir, TrialState
from parcel_hpc.testing import faults, launch, parcel_hpc
from parcel_hpc.testing.runs import LaunchResult, decide_every_hold, signalled_once, subprocess_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT / "examples")}
GANG = [
    "trainer.target=parcel_loop:train_ddp",
    "~space.params.hidden",
    "~space.params.l2",
    "batch_size=choice(32)",
    "lr=choice(0.03)",
    "train.steps=60",
    "pruner=none",
    "resources.tasks_per_node=2",
]


def _search(root: Path, data_dir: Path, *extra: str, env: dict | None = None, trials: int = 1) -> SearchDir:
    args = [f"search.root={root}", "search.revision=g", f"search.n_trials={trials}", *GANG, *extra]
    res = launch(args, cwd=root, data_dir=data_dir, env={**ENV, **(env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return SearchDir(root / "g")


def _faulted(tmp_path: Path, data_dir: Path, fault: str, *extra: str) -> SearchDir:
    return _search(tmp_path, data_dir, *extra, env=faults.rank_fault_env(tmp_path / "markers", fault))


def _found_hung(said: str, bound_s: int = 5) -> bool:
    """Rank 0 named rank 1 as never finishing step 16, past the bound and within twice it: its watchdog
    looks every half second, and on a loaded machine the look itself can come late (6 s seen in the suite)."""
    waited = re.search(r"rank 1 never finished step 16: rank 0 waited (\d+) s in it", said)
    return waited is not None and bound_s <= int(waited.group(1)) <= 2 * bound_s


pytestmark = pytest.mark.xdist_group("gangs-local")  # one worker runs the module: the uninterrupted gang once, not once a worker


@pytest.fixture(scope="module")
def whole(tmp_path_factory, artifacts, nvml_dir):
    """The gang uninterrupted: its search directory and its one trial's record. Each rank is granted one
    of two GPUs the fake driver library (tests/fakes/fake_nvml.c) answers for, device 0 at 40 %
    utilization and device 1 at 70 %; the example trains on the CPU (gloo) whatever it is granted."""
    root = tmp_path_factory.mktemp("gang")
    shutil.copytree(artifacts["dir"], root / "data")
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1", "LD_LIBRARY_PATH": str(nvml_dir), "FAKE_NVML_UTILIZATION": "40,70"}
    search = _search(root, root / "data", "resources.gpus=1", env=gpus)
    return search, search.record("t0000")


def test_a_gang_is_one_trial_one_attempt_with_one_checkpoint_across_its_ranks(whole):
    search, record = whole
    assert record.state is TrialState.COMPLETED and len(record.attempts) == 1
    # Rank 0 sees its own GPUs only: the attempt's allocation is left to the request, every rank's.
    assert record.attempts[0].gpus is None
    ckpt_dir = search.path / "checkpoints" / "t0000"
    manifest = json.loads((ckpt_dir / "ckpt-000060.manifest.json").read_text())
    assert manifest["world_size"] == 2 and [part[0] for part in manifest["parts"]] == [0, 1]
    for rank in (0, 1):
        header = ckpt_format.header(ckpt_dir / f"ckpt-000060.rank-{rank:04d}.h5")
        assert header["extra"]["gang"] == {"rank": rank, "world_size": 2, "attempt": 1}
    assert len(list(ckpt_dir.glob("claim-*.json"))) == 2  # one claim (taken, released) for the gang
    # Each rank a process of the job: rank 1 ran in the same job as rank 0, with its own log.
    job = record.attempts[0].job_id
    assert "global_rank=1(2)" in (search.submitit_dir / "local" / f"{job}_1_log.out").read_text()


def test_each_rank_s_gpu_use_is_its_own_reading_and_reconcile_shows_it_per_rank(whole, tmp_path):
    search, record = whole
    use = record.attempts[0].device_use
    assert use is not None and use.devices == ("Fake GPU 0", "Fake GPU 1")  # rank 0's share, then rank 1's
    assert use.rank_utilization == (0.4, 0.7) and all(n >= 1 for n in use.rank_samples)
    assert min(0.4, 0.7) < use.utilization < max(0.4, 0.7)  # the gang's: every reading's mean
    report = json.loads(parcel_hpc(["reconcile", str(search.path), "--json"], cwd=search.path.parent).stdout)["campaigns"][0]
    ranks = report["ranks"]
    assert [(r["rank"], r["gpus"], r["device"], r["gpu_utilization"]) for r in ranks] == [(0, 1, "Fake GPU 0", 0.4), (1, 1, "Fake GPU 1", 0.7)]
    for r in ranks:  # each rank's half of the allocation, split by its own reading
        assert r["gpu_hours_used"] == pytest.approx(r["gpu_utilization"] * r["gpu_hours"]) and r["gpu_hours_idle"] == pytest.approx(
            r["gpu_hours"] - r["gpu_hours_used"]
        )
    (line,) = report["attempts"]
    assert sum(r["gpu_hours"] for r in ranks) == pytest.approx(line["gpu_hours"]) and line["gpus"] == 2  # both ranks' GPUs, charged
    assert line["gpu_hours_used"] == pytest.approx(sum(r["gpu_hours_used"] for r in ranks))  # the run's used: its ranks'
    table = parcel_hpc(["reconcile", str(search.path)], cwd=search.path.parent, env={"COLUMNS": "250"}).stdout
    assert "GPU util" in table and "70%" in table and "40%" in table
    html = tmp_path / "reconcile.html"
    assert parcel_hpc(["reconcile", str(search.path), "--html", str(html)], cwd=tmp_path).returncode == 0
    dom = check_html_plots(html, tmp_path, at_least=0, sections=["<h2>per rank</h2>", "GPU util", "GPU-h idle"])
    assert "70%" in dom.split("<h2>per rank</h2>", 1)[1]  # rank 1's reading, in its row as Chromium rendered it


def _params(path: Path) -> dict:
    return ckpt_format.read(path).params


def test_a_gang_s_winner_reruns_as_a_gang_of_its_shape_bit_equal_then_is_evaluated_once_and_released(whole, tmp_path):
    search, record = whole
    copy = tmp_path / "g"  # its plan still reads the gang's own checkpoints; the selection lands in the copy
    shutil.copytree(search.path, copy)

    def cli(*argv: str):
        res = parcel_hpc([argv[0], str(copy), *argv[1:]], cwd=tmp_path, env=ENV)
        assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
        return res

    ended = decide_every_hold(cli("select", "--now", "--reason", "a gang's winner"), lambda why: cli("decide", "--accept", "--by", "Dana", "--reason", why))
    assert ended.returncode == 0 and ended.stdout.splitlines()[0] == "evaluate:final-holdout", ended.stdout + ended.stderr
    result = json.loads((copy / "selection" / "1" / "rerun" / "result.json").read_text())
    assert result["selected_metric"] == result["artifact_metric"] == result["rerun_metric"] == record.metric
    # The rerun ran as the gang did (2 ranks, each its own process, one checkpoint across them) and
    # reproduced every weight of the gang's last step bit for bit; one rank differs in every weight (docs/gangs.md).
    chain = Path(result["run_dir"]) / "rerun-chain"  # shown by its name: the copy's
    assert json.loads((chain / "ckpt-000060.manifest.json").read_text())["world_size"] == 2
    for rank in (0, 1):
        rerun, trained = _params(chain / f"ckpt-000060.rank-000{rank}.h5"), _params(search.path / "checkpoints" / "t0000" / f"ckpt-000060.rank-000{rank}.h5")
        weights = [k for k in trained if k.startswith("model/")]
        assert weights and all(np.array_equal(rerun[k], trained[k]) for k in weights)
    assert result["artifact"]["from"].endswith("ckpt-000060.rank-0000.h5")  # rank 0's replica is the selected artifact
    assert result["job"]["resources"] == {"cpus": 2, "gpus": 2, "ranks": 2}  # the job is charged as the gang it ran
    # The artifact the rerun checked (one file, from rank 0's replica) is what the final evaluation scores and the release ships.
    final = cli("evaluate-final")
    assert final.returncode == 0 and final.stdout.splitlines()[0] == "evaluate:final-holdout", final.stdout + final.stderr
    released = cli("release")
    assert released.returncode == 0 and released.stdout.splitlines()[0] == "release:registered", released.stdout + released.stderr
    packet = json.loads((copy / "release" / "packet.json").read_text())
    assert packet["selection"]["trial_id"] == "t0000" and packet["artifact"]["sha256"] == result["artifact"]["sha256"]


def _select_faulted(search: Path, tmp_path: Path, fault: str, **env: str) -> LaunchResult:
    """``select`` on ``search`` with ``fault`` (``faults.rank_fault``) on a rank of its rerun job, once."""
    faulted = {**ENV, **faults.rank_fault_env(tmp_path / "rerun-markers", fault), **env}
    return parcel_hpc(["select", str(search), "--now", "--reason", "a faulted rerun"], cwd=tmp_path, env=faulted)


def _rerun_ended(search: Path) -> dict:
    """How the selection's rerun (recorded like a trial) ended."""
    return json.loads(next((search / "selection").rglob("records/rerun/journal-*.jsonl")).read_text().splitlines()[-1])


def test_a_rank_raising_in_the_gang_s_rerun_ends_the_rerun_job_in_one_line_naming_that_rank(whole, tmp_path):
    search, _ = whole
    copy = tmp_path / "g"
    shutil.copytree(search.path, copy)
    res = _select_faulted(copy, tmp_path, "1:5:raise")
    assert res.returncode == 3 and res.stdout.splitlines()[0] == "hold:invalid-winner", res.stdout + res.stderr
    # Rank 0's collective broke when rank 1 left; the failure named is rank 1's, as it reported it.
    assert "ended without a result: error: rerun: rank 1 failed after step 5: RuntimeError: injected fault on rank 1 at step 5" in res.stdout
    ended = _rerun_ended(copy)
    assert ended["how"] == "failed" and ended["step"] == 5 and ended["message"].startswith("RankFailed: rank 1 failed after step 5")
    assert "Traceback" not in res.stdout + res.stderr and not (copy / "selection" / "1" / "rerun" / "result.json").exists()


def test_another_rank_asking_for_the_final_partition_in_the_gang_s_rerun_is_the_job_s_refusal(whole, tmp_path):
    search, _ = whole
    copy = tmp_path / "g"
    shutil.copytree(search.path, copy)
    res = _select_faulted(copy, tmp_path, "1:7:final", **{faults.FINAL_PATH_ENV: str(search.path.parent / "data" / "final-group_r8.json")})
    assert res.returncode == 3 and "ended without a result: reject:final_partition: on rank 1: trainer code" in res.stdout, res.stdout + res.stderr
    ended = _rerun_ended(copy)
    assert ended["how"] == "rejected" and ended["outcome"] == "reject:final_partition" and "final-group_r8.json" in ended["reason"], ended


# A selection of ``argv[2]`` frozen by hand, then its
# selected artifact taken and rescored as the rerun job takes it: one JSON line, or the job's one-line error.
RESCORE = """
import json, sys
from pathlib import Path
from parcel_hpc.errors import UsageError
from parcel_hpc.ledger import JobRole, SearchDir
from parcel_hpc.selection import jobs
from parcel_hpc.selection.store import SelectionStore
store = SelectionStore(SearchDir(Path(sys.argv[1])))
record = store.search.record(sys.argv[2])
store.freeze(1, {"selection": 1, "trial_id": sys.argv[2], "metric": record.metric})
ctx = jobs._Context(store, 1, JobRole.RERUN)
try:
    trainer, found = jobs.selected_artifact(ctx)
except UsageError as exc:
    sys.exit(f"error: {exc}")
val = ctx.data.validation
rescored = ctx.metric(ctx.scores(trainer, "validation", len(val), found.step), val.labels)
print(json.dumps({"selected": record.metric, "rescored": rescored, "step": found.step, "part": found.path.name}))
"""


def _rescored(search: Path, trial: str = "t0000") -> subprocess.CompletedProcess:
    env = subprocess_env(None, ENV)
    return subprocess.run([sys.executable, "-c", RESCORE, str(search), trial], cwd=search.parent, env=env, capture_output=True, text=True, timeout=300)


def test_a_gang_s_selected_artifact_is_rank_0_s_replica_and_rescores_to_exactly_its_selected_value(whole, tmp_path):
    search, record = whole
    copy = tmp_path / "g"  # the selection frozen by hand lands in a copy; its plan still reads the gang's own checkpoints
    shutil.copytree(search.path, copy)
    res = _rescored(copy)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    # Rank 1's part predicted rank 0's validation frames bit for bit (else it is refused), and rank 0's, loaded by
    # one process, gives the very number the gang's rank 0 validated at its last step.
    assert out == {"selected": record.metric, "rescored": record.metric, "step": 60, "part": "ckpt-000060.rank-0000.h5"}
    # Its rerun job run by hand as one task (not as select submits it): refused in one line before anything is read, no result.
    job = parcel_hpc(["selection-job", str(copy), "rerun", "--selection", "1"], cwd=tmp_path, env=ENV)
    assert job.returncode == 2 and len(job.stderr.strip().splitlines()) == 1, job.stderr
    assert "t0000 is a trial of 1 node x 2 ranks x 1 GPU: its rerun runs as a gang of that shape, and this job runs 1 task" in job.stderr
    assert not list((copy / "selection").rglob("result*.json"))


def test_a_gang_whose_parts_are_not_replicas_is_refused_in_one_line(tmp_path, data_dir):
    """A step whose rank 1 holds other weights than rank 0 (as a sharded model's parts would): rank 0's
    part alone is not the gang's model, so it is refused rather than rescored and released."""
    search = _search(tmp_path, data_dir, "resources.gpus=0")
    ckpt_dir = search.path / "checkpoints" / "t0000"
    identity = TrialIdentity.from_claim_json(ckpt_format.header(ckpt_dir / "ckpt-000060.rank-0000.h5"))
    committed = Committed.newest(ckpt_dir, identity, 2)
    assert committed is not None
    attempt = committed.manifest.attempt
    for rank in (0, 1):  # step 61, committed as the gang commits, rank 1's weights moved
        part = committed.part(rank)
        params = {k: v + 0.5 if rank == 1 and k.startswith("model/") and v.dtype.kind == "f" else v for k, v in part.params.items()}
        gang = GangCheckpoints(ckpt_dir, identity, rank=rank, world_size=2, attempt=attempt)
        gang.write_part(gang.prepare(61, params, part.optimizer, part.rng_state, trainer_extra(part)))
    GangCheckpoints(ckpt_dir, identity, rank=0, world_size=2, attempt=attempt).commit(61, wait_s=5)
    res = _rescored(search.path)
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr[-3000:]
    assert "t0000's checkpoint parts at step 61 are not replicas: rank 1's part predicts otherwise than rank 0's" in res.stderr


def test_a_signal_on_rank_0_requeues_the_whole_gang_which_resumes_bit_equal(tmp_path, data_dir, whole):
    record = signalled_once([*GANG, "train.step_seconds=0.05"], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert 10 <= record.attempts[0].step < 60
    assert record.metric == whole[1].metric


def test_the_signal_reaching_another_rank_first_stops_every_rank_at_one_step(tmp_path, data_dir, whole):
    search = _faulted(tmp_path, data_dir, "1:23:signal")
    record = search.record("t0000")
    first, second = record.attempts
    # Rank 1 says so after step 23; rank 0, deciding a step ahead, reads it at step 24: every rank stops at 25.
    assert (first.how, first.cause, first.step) == (AttemptEnd.INTERRUPTED, Cause.TIMEOUT, 25)
    assert second.resumed_from == 25 and record.metric == whole[1].metric


def test_a_rank_s_exception_is_the_trial_s_failure_with_that_rank_s_traceback(tmp_path, data_dir, whole):
    search = _faulted(tmp_path, data_dir, "1:12:raise")
    record = search.record("t0000")
    first = record.attempts[0]
    assert (first.how, first.cause) == (AttemptEnd.FAILED, Cause.EXCEPTION)
    assert "rank 1 failed after step 12" in first.message and "injected fault on rank 1 at step 12" in first.message
    assert record.state is TrialState.COMPLETED and record.metric == whole[1].metric  # retried once, as any failure
    shown = parcel_hpc(["logs", str(search.path), "t0000", "--attempt", "1"]).stdout
    assert "injected fault on rank 1 at step 12" in shown and "faults.py" in shown and "rank_fault" in shown, shown


def test_a_rank_that_dies_is_an_interruption_and_the_gang_is_requeued_whole(tmp_path, data_dir, whole):
    search = _faulted(tmp_path, data_dir, "1:25:exit")
    record = search.record("t0000")
    first, second = record.attempts
    assert (first.how, first.cause) == (AttemptEnd.INTERRUPTED, Cause.RANK_LOST)
    assert second.resumed_from == 20 and second.how is AttemptEnd.COMPLETED  # the last complete step before it
    assert record.metric == whole[1].metric


def test_a_rank_stalled_mid_step_is_found_while_rank_0_waits_in_the_collective(tmp_path, data_dir, whole):
    """Rank 1 stops inside its next step, before the gradients' all-reduce: rank 0 waits in gloo's
    all-reduce (its own timeout: 30 minutes), not on the channel. Its watchdog names rank 1 within
    the bound, ends it and the attempt; the retry completes."""
    search = _faulted(tmp_path, data_dir, "1:15:stall", "hydra.launcher.signal_delay_s=5")
    record = search.record("t0000")
    first = record.attempts[0]
    assert (first.how, first.cause) == (AttemptEnd.FAILED, Cause.RANK_HUNG), first
    assert _found_hung(first.message), first.message
    assert record.state is TrialState.COMPLETED and record.metric == whole[1].metric
    # Its selection's rerun, stalled the same way: rank 0's watchdog ends the job within the bound, naming rank 1.
    res = _select_faulted(search.path, tmp_path, "1:15:stall")
    assert res.returncode == 3 and "ended without a result: error: rerun: rank 1 never finished step 16:" in res.stdout and _found_hung(res.stdout), res.stdout
    assert tuple(_rerun_ended(search.path)[k] for k in ("how", "cause", "step")) == ("failed", "rank_hung", 15)


def test_a_hung_rank_is_ended_within_the_bound_and_fails_the_attempt(tmp_path, data_dir, whole):
    search = _faulted(tmp_path, data_dir, "1:15:hang", "hydra.launcher.signal_delay_s=5")
    record = search.record("t0000")
    first = record.attempts[0]
    assert (first.how, first.cause) == (AttemptEnd.FAILED, Cause.RANK_HUNG)
    # Rank 1 stops before its report on step 15; rank 0, a step ahead, goes on into step 16's all-reduce.
    assert _found_hung(first.message), first.message
    assert record.state is TrialState.COMPLETED and record.metric == whole[1].metric


def test_another_rank_asking_for_the_final_partition_rejects_the_trial(tmp_path, data_dir):
    env = {**ENV, **faults.rank_fault_env(tmp_path / "markers", "1:7:final")}
    env[faults.FINAL_PATH_ENV] = str(data_dir / "final-group_r8.json")
    res = launch([f"search.root={tmp_path}", "search.revision=g", "search.n_trials=1", *GANG], cwd=tmp_path, data_dir=data_dir, env=env)
    record = SearchDir(tmp_path / "g").record("t0000")
    assert record.state is TrialState.REJECTED and len(record.attempts) == 1, (res.stderr[-2000:], record.reason)
    assert record.reason.startswith("reject:final_partition: on rank 1: trainer code") and "final-group_r8.json" in record.reason, record.reason


# search.seed=11 draws (32, 0.03), the uninterrupted gang's, then again (a duplicate, not run), then (32, 0.05).
SLOTTED = [a for a in GANG if not a.startswith(("batch_size=", "lr="))] + ["batch_size=choice(32,16)", "lr=choice(0.03,0.05)", "search.seed=11"]


def _slotted(tmp_path: Path, data_dir: Path, env: dict | None = None) -> SearchDir:
    args = [f"search.root={tmp_path}", "search.revision=g", "search.n_trials=3", *SLOTTED, "hydra.launcher.dispatch=slots", "hydra.launcher.parallelism=1"]
    res = launch(args, cwd=tmp_path, data_dir=data_dir, env={**ENV, **(env or {})})
    assert res.returncode == 0, res.stderr[-3000:]
    return SearchDir(tmp_path / "g")


def test_gangs_run_one_after_another_in_a_slot_shaped_like_them(tmp_path, data_dir, whole):
    """``dispatch=slots``: one job of the gang's shape; its rank 0 takes each trial in turn and tells its
    other rank which, and both train it as they would in a job of its own (the same metric)."""
    search = _slotted(tmp_path, data_dir)
    records = list(search.records())
    assert len(records) == 2 and all(r.state is TrialState.COMPLETED and len(r.attempts) == 1 for r in records)
    (job,) = {r.attempts[0].job_id for r in records}  # the one slot ran them all
    for r in records:
        manifest = json.loads((search.path / "checkpoints" / r.trial_id / "ckpt-000060.manifest.json").read_text())
        assert manifest["world_size"] == 2 and manifest["attempt"] == 1
    (same,) = [r for r in records if r.spec.params == whole[1].spec.params]
    assert same.metric == whole[1].metric  # as the gang trained it in a job of its own
    assert "global_rank=1(2)" in (search.submitit_dir / "local" / f"{job}_1_log.out").read_text()  # rank 1: the slot's other task


def test_a_rank_lost_in_a_slot_requeues_the_slot_which_resumes_that_trial_first(tmp_path, data_dir, whole):
    env = faults.rank_fault_env(tmp_path / "markers", "1:25:exit")
    search = _slotted(tmp_path, data_dir, env)
    first, *_ = list(search.records())
    lost, resumed = first.attempts
    assert (lost.how, lost.cause) == (AttemptEnd.INTERRUPTED, Cause.RANK_LOST) and resumed.resumed_from == 20
    assert resumed.job_id == lost.job_id and first.metric == whole[1].metric  # the slot, requeued whole, ran it first
    assert all(r.state is TrialState.COMPLETED for r in search.records())


def test_a_rank_failing_in_a_slot_ends_that_slot_and_a_fresh_one_runs_the_rest(tmp_path, data_dir, whole):
    env = faults.rank_fault_env(tmp_path / "markers", "1:12:raise")
    search = _slotted(tmp_path, data_dir, env)
    first, second = search.records()
    failed, retried = first.attempts
    assert (failed.how, failed.cause) == (AttemptEnd.FAILED, Cause.EXCEPTION) and "injected fault on rank 1 at step 12" in failed.message
    assert retried.how is AttemptEnd.COMPLETED and retried.job_id != failed.job_id and first.metric == whole[1].metric
    # The failed rank's process ended, and the gang's process group with it: its slot took no other trial.
    (only,) = second.attempts
    assert only.how is AttemptEnd.COMPLETED and only.job_id != failed.job_id
