"""The function form end to end on the local executor (issue 46): a plain PyTorch loop kept as it is
(examples/parcel_loop) runs a search with pruning, is selected, evaluated once and released (served
from its saved state through its ``load``), and a trial signalled mid-run saves at the next step its
loop tells the run of and resumes to exactly the uninterrupted metric."""

import csv
import functools
import io
import json
import shutil
from pathlib import Path

import pytest
from reference import reference_run

from parcel_hpc.data import load_partition, read_split
from parcel_hpc.ledger import MetricResume, SearchDir
from parcel_hpc.release import load_release
from parcel_hpc.testing import decide_every_hold, launch, parcel_hpc
from parcel_hpc.testing.runs import signalled_once

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TARGET = "parcel_loop:train"
ENV = {"PYTHONPATH": str(ROOT / "examples")}
SPACE = ["~space.params.hidden", "~space.params.l2", "batch_size=choice(16,32)", "lr=choice(0.0003,0.03)", "train.steps=120"]


pytestmark = pytest.mark.xdist_group("loop-local")  # one worker runs the module: the loop's search once, not once a worker


@pytest.fixture(scope="module")
def uninterrupted(artifacts):
    """The metric a trial's params reach in 120 uninterrupted steps, computed in this process."""
    return functools.partial(reference_run(TARGET, artifacts["snapshot_path"], artifacts["split_path"]), steps=120)


@pytest.fixture(scope="module")
def loop_search(tmp_path_factory, artifacts):
    """Six proposals of the example, one trial at a time, with a milestone where the learning rates
    part: the small one is pruned behind the large one."""
    root = tmp_path_factory.mktemp("loop")
    shutil.copytree(artifacts["dir"], root / "data")
    args = [f"search.root={root / 'runs'}", "search.revision=loop", f"trainer.target={TARGET}", "search.n_trials=6", *SPACE]
    args += ["hydra.launcher.parallelism=1", "pruner.milestones=[82,120]", "pruner.min_peers=1"]
    res = launch(args, cwd=root, data_dir=root / "data", env=ENV)
    assert res.returncode == 0, res.stderr[-2000:]
    return {"root": root, "search": root / "runs" / "loop"}


def test_a_search_with_a_loop_of_its_own_prunes_and_completes(loop_search, uninterrupted):
    search = SearchDir(loop_search["search"])
    records = list(search.records())
    states = [r.state.value for r in records]
    assert "pruned" in states and "completed" in states and set(states) <= {"pruned", "completed"}, states
    for r in records:
        milestones = [e.data for e in search.events(r.trial_id) if e.kind.value == "milestone"]
        assert milestones[0].step == 82 and set(milestones[0].train) == {"loss", "lr"}  # the loop's own metrics ride along
        if r.state.value == "completed":
            assert r.metric == uninterrupted(r.spec.params) and r.metric_resume is MetricResume.UNINTERRUPTED


def test_the_loop_s_own_metrics_are_shown_in_status_and_export_beside_the_metric_that_decides(loop_search):
    """What the loop hands ``run.stepped`` (loss, lr) at the last step it was validated: in status's
    JSON and table and in export's ``train_<name>`` columns; the pinned miss-cost alone pruned and ranks."""
    search = loop_search["search"]
    records = {r.trial_id: r for r in SearchDir(search).records()}
    shown = json.loads(parcel_hpc(["status", str(search), "--json"]).stdout)["trials"]
    assert {t["trial_id"]: t["train_metrics"] for t in shown} == {tid: dict(r.train_metrics) for tid, r in records.items()}
    assert all(set(r.train_metrics) == {"loss", "lr"} for r in records.values())
    table = parcel_hpc(["status", str(search)], env={"COLUMNS": "400"}).stdout
    assert "own metrics" in table and all(f"loss={r.train_metrics['loss']:.4g}" in table for r in records.values()), table
    rows = {row["trial_id"]: row for row in csv.DictReader(io.StringIO(parcel_hpc(["export", str(search)]).stdout))}
    assert list(rows[next(iter(rows))])[-2:] == ["train_loss", "train_lr"]  # last: they inform, the columns before decide
    for tid, r in records.items():
        assert float(rows[tid]["train_loss"]) == r.train_metrics["loss"] and float(rows[tid]["train_lr"]) == r.train_metrics["lr"]
        assert rows[tid]["metric_resume"] == r.metric_resume.value


def test_a_loop_of_its_own_is_selected_evaluated_once_and_released_serving_from_its_state(loop_search, artifacts):
    """Selection rescores the winner's saved state and checks serving parity through the loop's
    ``load``; the release serves raw frames from the registry entry's state alone."""
    root, search = loop_search["root"], loop_search["search"]

    def cli(*args):
        return parcel_hpc([*args, str(search)], cwd=root, env=ENV, timeout=600)

    sel = cli("select", "--now", "--reason", "six trials of the loop example are the whole test search")
    assert sel.returncode in (0, 3), sel.stdout + sel.stderr
    ended = decide_every_hold(sel, lambda reason: cli("decide", "--accept", "--by", "Dana Reviewer", "--reason", reason))
    assert ended.returncode == 0 and ended.stdout.startswith("evaluate:final-holdout"), ended.stdout + ended.stderr
    assert cli("evaluate-final").returncode == 0
    rel = cli("release")
    assert rel.returncode == 0 and rel.stdout.splitlines()[0] == "release:registered", rel.stdout + rel.stderr
    packet = json.loads((search / "release" / "packet.json").read_text())
    assert packet["lineage"]["what_ran"]["trainer"]["target"] == TARGET
    model = load_release(packet["registry_path"])
    frames = load_partition(artifacts["snapshot_path"], read_split(artifacts["split_path"]), "validation").images[:6]
    scores = model.serve(frames)
    assert scores.shape == (6,) and ((scores >= 0) & (scores <= 1)).all()


def test_a_signalled_loop_saves_at_its_next_step_and_resumes_exactly(tmp_path, data_dir, uninterrupted):
    # The flag is read at the loop's next run.stepped, which says a checkpoint is due: the rerun resumes
    # at exactly the step the interrupted attempt reached, whatever the cadence (``signalled_once``).
    rec = signalled_once([f"trainer.target={TARGET}", "pruner=none", "train.step_seconds=0.08", *SPACE], cwd=tmp_path, data_dir=data_dir, env=ENV)
    assert 10 <= rec.attempts[0].step < 120
    assert rec.metric == uninterrupted(rec.spec.params)
